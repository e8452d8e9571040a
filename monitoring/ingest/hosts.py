"""Which GPUs a batch's readings are of: the reporting hosts' GPUs, read in one query with all ingest needs of
them, and each reading's GPU found among them, or the batch refused (or, from the portal's own collectors,
the reading passed over and named).

The query reads, besides each node and its present GPUs, what Latest says of each GPU (the newest sample of
any of its slots, which tells a resent batch from a new one; the uncorrected ECC count it last reported) and
its live allocations' instances (to bind their UUIDs). Its plan depends on how big those tables are, so it
is planned at each run rather than prepared (monitoring.storage.statements).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import msgspec
from django.utils.translation import gettext as _

from monitoring.collectors import GpuReading, Reading
from monitoring.conf import settings
from monitoring.ingest import copies
from monitoring.models import Latest
from monitoring.models.samples import WHOLE_GPU
from monitoring.storage.statements import bound
from pools.models import Allocation, Cluster, GpuCapacity, NodeCapacity
from portal.errors import InvalidInput


class Gpu(NamedTuple):
    """What ingest knows of a GPU of the reporting hosts, read with its node in one query."""

    pk: int
    node_id: int
    name: str  # as GpuCapacity names itself: cluster/node/index
    index: int
    uuid: str
    mig_enabled: bool
    layout: list
    planned_layout: list | None
    newest: datetime | None  # the newest sample of any of its slots, as Latest says
    ecc_before: int | None  # the uncorrected ECC count it last reported
    held: tuple[tuple[int, str], ...]  # its live allocations: (first slice, instance UUID)


class Target(NamedTuple):
    gpu: Gpu
    reading: GpuReading
    host: str
    at: datetime
    complete: bool  # the host reported all its GPUs (an agent does); a missing GPU is then lost


class Hosts(NamedTuple):
    """The reporting hosts that are nodes of the cluster, by name, and their present GPUs."""

    nodes: dict[str, int]
    gpus: list[Gpu]


# --- checking ----------------------------------------------------------------------------------------


def accepted_times(*, now: datetime) -> tuple[datetime, datetime]:
    """The oldest and the newest time a reading may carry at `now`; outside them a batch is refused."""
    return (
        now - timedelta(seconds=settings.MONITORING_SAMPLE_MAX_AGE_SECONDS),
        now + timedelta(seconds=settings.MONITORING_SAMPLE_MAX_AHEAD_SECONDS),
    )


# One query for all ingest needs of the reporting hosts. The newest figures' aggregates carry a FILTER, so
# that PostgreSQL reads them from the GPU's own rows rather than scanning the fleet's by time for a max().
_HOSTS_SQL = f"""
SELECT n.id, n.name, g.id, g.index, g.uuid, g.mig_enabled, g.layout, g.planned_layout, l.newest, l.ecc,
    a.starts, a.uuids
FROM {NodeCapacity._meta.db_table} n
LEFT JOIN {GpuCapacity._meta.db_table} g ON g.node_id = n.id AND g.present
LEFT JOIN LATERAL (
    SELECT max(at) AS newest, max(ecc_uncorrected) FILTER (WHERE slot = {WHOLE_GPU}) AS ecc
    FROM {Latest._meta.db_table} WHERE gpu_id = g.id
) l ON TRUE
LEFT JOIN LATERAL (
    SELECT array_agg(lower(slices) ORDER BY id) AS starts, array_agg(instance_uuid ORDER BY id) AS uuids
    FROM {Allocation._meta.db_table} WHERE gpu_id = g.id AND released_at IS NULL
) a ON TRUE
WHERE n.cluster_id = %s AND n.name {{names}} AND n.present
"""
_ONE_HOST_SQL = _HOSTS_SQL.format(names="= %s")  # a node agent's batch: its own host's readings
_HOSTS_SQL = _HOSTS_SQL.format(names="= ANY(%s)")

# What tells whether a batch's readings are of the cluster's GPUs, and how many samples they make: the hosts'
# present GPUs alone (an agent's batch, checked as it comes; monitoring.ingest.accepted).
_KNOWN_SQL = f"""
SELECT n.id, n.name, g.id, g.index, g.uuid, g.mig_enabled, g.layout, g.planned_layout, NULL, NULL, NULL, NULL
FROM {NodeCapacity._meta.db_table} n
LEFT JOIN {GpuCapacity._meta.db_table} g ON g.node_id = n.id AND g.present
WHERE n.cluster_id = %s AND n.name {{names}} AND n.present
"""
_ONE_KNOWN_SQL = _KNOWN_SQL.format(names="= %s")
_KNOWN_SQL = _KNOWN_SQL.format(names="= ANY(%s)")
# The same of a page of a cluster's present nodes, in the order of their ids (see _copy_cluster_hosts).
_CLUSTER_KNOWN_SQL = f"""
SELECT n.id, n.name, g.id, g.index, g.uuid, g.mig_enabled, g.layout, g.planned_layout, NULL, NULL, NULL, NULL
FROM (
    SELECT id, name FROM {NodeCapacity._meta.db_table}
    WHERE cluster_id = %s AND present AND id > %s ORDER BY id LIMIT %s
) n
LEFT JOIN {GpuCapacity._meta.db_table} g ON g.node_id = n.id AND g.present
"""
_CLUSTER_PAGE = 1000  # nodes a query: a process holds one page's rows at a time, whatever the cluster's size


_json = msgspec.json.Decoder().decode


def read(cluster: Cluster, names: set[str], *, identity_only: bool = False) -> Hosts:
    """The present nodes among `names` and their present GPUs; with `identity_only`, without what Latest says
    of them or their allocations (newest, ecc_before and held left empty), which is all a check needs."""
    if not names:
        return Hosts({}, [])
    one, many = (_ONE_KNOWN_SQL, _KNOWN_SQL) if identity_only else (_ONE_HOST_SQL, _HOSTS_SQL)
    with bound(prepared=identity_only) as cursor:
        if len(names) == 1:
            cursor.execute(one, [cluster.pk, next(iter(names))])
        else:
            cursor.execute(many, [cluster.pk, list(names)])
        return _hosts(cluster, cursor)


def _hosts(cluster: Cluster, rows) -> Hosts:
    """The hosts and GPUs of the rows of a query above."""
    nodes: dict[str, int] = {}
    gpus: list[Gpu] = []
    for node_id, node, pk, index, uuid, mig, layout, plan, newest, ecc, starts, uuids in rows:
        nodes[node] = node_id
        if pk is not None:
            name = f"{cluster.name}/{node}/{index}"
            held = tuple(zip(starts, uuids, strict=True)) if starts else ()
            # JSON columns come as text (Django's choice), read in C: a batch of many hosts has thousands.
            layout = _json(layout) if layout else []
            plan = _json(plan) if plan is not None else None
            gpus.append(Gpu(pk, node_id, name, index, uuid, mig, layout, plan, newest, ecc, held))
    return Hosts(nodes, gpus)


_COPIES = "agent-host"  # this process's copies of hosts' present GPUs, by (cluster id, host)


def known(cluster: Cluster, names: set[str], *, fresh: bool = False) -> tuple[Hosts, bool]:
    """The present nodes among `names` and their present GPUs as `read(identity_only=True)` reads them:
    from this process's copies (monitoring.ingest.copies) when it holds one of each host and not `fresh`
    (with every host of the cluster, where this process has not read them within a copy's life), else
    read, and kept. Also whether it came from copies (which may miss what changed since they were read:
    refuse nothing on them alone)."""
    if names and not fresh:
        held = _held(cluster, names)
        if held is None and copies.read_all(_COPIES, cluster.pk, lambda: _copy_cluster_hosts(cluster)):
            held = _held(cluster, names)
        if held is not None:
            return held, True
    found = read(cluster, names, identity_only=True)
    _keep(cluster, found)
    return found, False


def _held(cluster: Cluster, names: set[str]) -> Hosts | None:
    """The hosts `names` from this process's copies, or None unless it holds a copy of each."""
    held = {name: copies.get(_COPIES, (cluster.pk, name)) for name in names}
    if None in held.values():
        return None
    nodes = {name: node_id for name, (node_id, _gpus) in held.items()}
    return Hosts(nodes, [gpu for _node_id, gpus in held.values() for gpu in gpus])


def _keep(cluster: Cluster, found: Hosts) -> None:
    by_node: dict[int, list[Gpu]] = {}
    for gpu in found.gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    held = {(cluster.pk, name): (pk, tuple(by_node.get(pk, ()))) for name, pk in found.nodes.items()}
    copies.keep_all(_COPIES, held.items())  # each host's node id and GPUs, by the cluster's id and its name


def _copy_cluster_hosts(cluster: Cluster) -> None:
    """Keep a copy of every present host of `cluster` (as many as copies hold), once a copy's life
    (copies.read_all). Every agent of a fleet posts within 15 s, to a process that has just started or whose
    copies have just ended: read at once, a page of nodes a query, a host costs the process less than half
    the processor time of a query of its own (about 0.65 s for 12,500 nodes of 8 GPUs). A host added since
    is read on its own."""
    left, after = settings.MONITORING_AGENT_COPIES, 0
    while left > 0:
        page = min(left, _CLUSTER_PAGE)
        with bound(prepared=False) as cursor:  # seldom run; its plan depends on the clusters' sizes
            cursor.execute(_CLUSTER_KNOWN_SQL, [cluster.pk, after, page])
            found = _hosts(cluster, cursor)
        _keep(cluster, found)
        if len(found.nodes) < page:
            break
        left -= page
        after = max(found.nodes.values())


def targets(
    cluster: Cluster,
    readings: Sequence[Reading],
    found: Hosts,
    *,
    strict: bool,
    now: datetime,
    problems: list[str],
    times: tuple[datetime, datetime] | None = None,
    complete: bool | None = None,
) -> list[Target]:
    """Each GPU reading with its GPU. `times`: the oldest and newest a reading may carry (else those taken at
    `now`); `complete`: whether each host reported all its GPUs (else `strict`: an agent's batch does)."""
    oldest, newest = times or accepted_times(now=now)
    complete = strict if complete is None else complete
    gpus: dict[tuple[int, str], Gpu] = {}
    by_index: dict[tuple[int, int], Gpu] = {}
    for gpu in found.gpus:
        if gpu.uuid:
            gpus[(gpu.node_id, gpu.uuid)] = gpu
        by_index[(gpu.node_id, gpu.index)] = gpu
    found_targets: list[Target] = []
    seen: set[tuple[int, datetime]] = set()
    for reading in readings:
        at = reading.at
        if at.tzinfo is None:
            raise InvalidInput(_("Reading times must carry a time zone."))
        if not oldest <= at <= newest:
            why = _("Host %(host)s reported a reading at %(at)s, outside %(oldest)s to %(newest)s.") % {
                "host": reading.host,
                "at": at.isoformat(),
                "oldest": oldest.isoformat(timespec="seconds"),
                "newest": newest.isoformat(timespec="seconds"),
            }
            _refuse_or_note(why, strict=strict, problems=problems)
            continue
        node = found.nodes.get(reading.host)
        if node is None:
            why = _("%(host)s is not a node of cluster %(cluster)s.") % {
                "host": reading.host,
                "cluster": cluster.name,
            }
            _refuse_or_note(why, strict=strict, problems=problems)
            continue
        for gpu_reading in reading.gpus:
            gpu = gpus.get((node, gpu_reading.uuid))
            if gpu is None:
                candidate = by_index.get((node, gpu_reading.index))
                gpu = candidate if candidate is not None and not candidate.uuid else None
            if gpu is None:
                why = _("Node %(node)s has no GPU %(uuid)s (index %(index)s) in the portal's inventory.") % {
                    "node": reading.host,
                    "uuid": gpu_reading.uuid or "?",
                    "index": gpu_reading.index,
                }
                _refuse_or_note(why, strict=strict, problems=problems)
                continue
            if (gpu.pk, at) in seen:
                _refuse_or_note(
                    _("GPU %(uuid)s appears twice at %(at)s.") % {"uuid": gpu_reading.uuid, "at": at},
                    strict=strict,
                    problems=problems,
                )
                continue
            seen.add((gpu.pk, at))
            found_targets.append(Target(gpu, gpu_reading, reading.host, at, complete))
    return found_targets


def _refuse_or_note(why: str, *, strict: bool, problems: list[str]) -> None:
    if strict:
        raise InvalidInput(why)
    problems.append(why)
