"""Capacity changes people make: registering clusters, draining, grouping.

Views, the API, admin actions and commands call these; each runs in one
transaction, locks what it changes and refuses bad input with a PortalError.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import capacity_version
from pools.models import Allocation, Cluster, GpuCapacity, GpuGroup, NodeCapacity
from pools.services import dispatch
from portal import audit
from portal.errors import InvalidInput
from portal.models import dns_label_validator

# Per list of a kubeconfig: the key under which each named entry keeps its settings.
KUBECONFIG_LISTS = {"clusters": "cluster", "contexts": "context", "users": "user"}
# Settings of the cluster and user in use that the Kubernetes client reads as text, and those it
# reads as mappings: any other type would crash the client later instead of being refused here.
KUBECONFIG_TEXT = {
    "cluster": (
        "server",
        "certificate-authority",
        "certificate-authority-data",
        "tls-server-name",
        "proxy-url",
    ),
    "user": (
        "token",
        "tokenFile",
        "client-certificate",
        "client-certificate-data",
        "client-key",
        "client-key-data",
        "username",
        "password",
    ),
}
KUBECONFIG_MAPPINGS = {"cluster": (), "user": ("exec", "auth-provider")}


def check_kubeconfig(text: str, context: str) -> None:
    """Refuse a kubeconfig the Kubernetes client could not use, saying what is wrong with it.

    Whatever the text holds, the only exception is InvalidInput: this runs on what an operator
    pastes into the admin or the command line, before anything is stored.
    """
    # Not only YAMLError: PyYAML's constructors raise ValueError, KeyError, IndexError or
    # AttributeError on odd tagged scalars (`!!int ''`, `!!timestamp abc`), RecursionError on deep nesting.
    try:
        config = yaml.safe_load(text)
    except Exception as error:
        raise InvalidInput(_("The kubeconfig is not valid YAML.")) from error
    if not isinstance(config, dict):
        raise InvalidInput(_("The kubeconfig must be a mapping with clusters, contexts and users."))
    if not config.get("clusters") or not config.get("contexts"):
        raise InvalidInput(_("The kubeconfig has no clusters or no contexts."))
    entries = {field: _kubeconfig_entries(config, field) for field in KUBECONFIG_LISTS}
    current = config.get("current-context")
    if current is not None and not isinstance(current, str):
        raise InvalidInput(_("In the kubeconfig, current-context must be a string."))
    chosen = context or current
    if not chosen:
        raise InvalidInput(_("The kubeconfig names no current context; choose one."))
    if chosen not in entries["contexts"]:
        raise InvalidInput(
            _("The kubeconfig has no context %(context)s (it has: %(names)s).")
            % {"context": chosen, "names": ", ".join(sorted(entries["contexts"]))}
        )
    wiring = entries["contexts"][chosen]
    cluster, user = wiring.get("cluster"), wiring.get("user")
    if not isinstance(cluster, str) or cluster not in entries["clusters"]:
        raise InvalidInput(
            _("In the kubeconfig, context %(context)s names no cluster from clusters.") % {"context": chosen}
        )
    if user is not None and (not isinstance(user, str) or (user and user not in entries["users"])):
        raise InvalidInput(
            _("In the kubeconfig, context %(context)s names a user that is not in users.")
            % {"context": chosen}
        )
    if not entries["clusters"][cluster].get("server"):
        raise InvalidInput(_("In the kubeconfig, cluster %(name)s has no server.") % {"name": cluster})
    used = [("clusters", "cluster", cluster)] + ([("users", "user", user)] if user else [])
    for field, key, name in used:
        found = entries[field][name]
        for setting in KUBECONFIG_TEXT[key]:
            if found.get(setting) is not None and not isinstance(found[setting], str):
                raise InvalidInput(
                    _("In the kubeconfig, %(setting)s of %(field)s entry %(name)s must be a string.")
                    % {"setting": setting, "field": field, "name": name}
                )
        for setting in KUBECONFIG_MAPPINGS[key]:
            if found.get(setting) is not None and not isinstance(found[setting], dict):
                raise InvalidInput(
                    _("In the kubeconfig, %(setting)s of %(field)s entry %(name)s must be a mapping.")
                    % {"setting": setting, "field": field, "name": name}
                )


def _kubeconfig_entries(config: dict, field: str) -> dict[str, dict]:
    """The named entries of one list of a kubeconfig (clusters, contexts, users), by name."""
    items = config.get(field)
    if items is None:
        return {}
    if not isinstance(items, list):
        raise InvalidInput(_("In the kubeconfig, %(field)s must be a list.") % {"field": field})
    key = KUBECONFIG_LISTS[field]
    found: dict[str, dict] = {}
    for number, item in enumerate(items, start=1):
        if not isinstance(item, dict):
            raise InvalidInput(
                _("In the kubeconfig, entry %(number)s of %(field)s is not a mapping.")
                % {"number": number, "field": field}
            )
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(
                _("In the kubeconfig, entry %(number)s of %(field)s has no name.")
                % {"number": number, "field": field}
            )
        if name in found:
            raise InvalidInput(
                _("In the kubeconfig, %(field)s has two entries named %(name)s.")
                % {"field": field, "name": name}
            )
        if not isinstance(item.get(key), dict):
            raise InvalidInput(
                _("In the kubeconfig, %(field)s entry %(name)s has no %(key)s mapping.")
                % {"field": field, "name": name, "key": key}
            )
        found[name] = item[key]
    return found


@dataclass(frozen=True)
class ClusterSettings:
    """What an operator gives to register a cluster or change it. `kubeconfig=None` keeps the one stored
    for a cluster of that name (checked again, since the context may change); text replaces it."""

    name: str
    driver: str = Cluster.Driver.KUBERNETES
    kubeconfig: str | None = None
    context: str = ""
    in_cluster: bool = False
    mig_config_map: str = ""
    # The cluster's Prometheus (scraping dcgm-exporter) that GPU figures are read from; None keeps the
    # stored one, "" clears it.
    prometheus_url: str | None = None


def check_cluster(wanted: ClusterSettings) -> None:
    """Refuse settings of a cluster that could not be used, saying why; `register_cluster` runs this too."""
    _check_name(wanted.name)
    existing = Cluster.objects.filter(name=wanted.name).first()
    if existing is not None and existing.driver != wanted.driver:
        raise InvalidInput(
            _("%(name)s is a %(driver)s cluster.") % {"name": wanted.name, "driver": existing.driver},
            field="driver",
        )
    if wanted.mig_config_map and wanted.mig_config_map.count("/") != 1:
        raise InvalidInput(_("The MIG config map is given as namespace/name."), field="mig_config_map")
    if wanted.prometheus_url:
        _check_prometheus_url(wanted.prometheus_url)
    if wanted.driver == Cluster.Driver.SIMULATED:
        if wanted.kubeconfig or wanted.in_cluster:
            raise InvalidInput(_("A simulated cluster takes no Kubernetes credentials."), field="kubeconfig")
        return
    if wanted.driver != Cluster.Driver.KUBERNETES:
        raise InvalidInput(
            _("Unknown cluster driver %(driver)s.") % {"driver": wanted.driver}, field="driver"
        )
    if wanted.in_cluster:
        return
    kubeconfig = wanted.kubeconfig
    if kubeconfig is None:
        kubeconfig = existing.kubeconfig() if existing is not None else ""
    if not kubeconfig:
        raise InvalidInput(
            _("A Kubernetes cluster needs a kubeconfig, or in-cluster credentials."), field="kubeconfig"
        )
    try:
        check_kubeconfig(kubeconfig, wanted.context)
    except InvalidInput as error:
        raise InvalidInput(error.message, field="kubeconfig") from error


def _check_prometheus_url(url: str) -> None:
    field = Cluster._meta.get_field("prometheus_url")
    try:
        field.run_validators(url)
    except ValidationError as error:
        raise InvalidInput(
            _("The Prometheus URL is an http or https address, e.g. http://prometheus.monitoring:9090."),
            field="prometheus_url",
        ) from error
    if len(url) > field.max_length:
        raise InvalidInput(
            _("A Prometheus URL has at most %(max)s characters.") % {"max": field.max_length},
            field="prometheus_url",
        )


def _check_name(name: str) -> None:
    try:
        dns_label_validator(name)
    except ValidationError as error:
        raise InvalidInput(
            _("Cluster name %(name)s: %(why)s") % {"name": name, "why": " ".join(error.messages)},
            field="name",
        ) from error
    if len(name) > 63:
        raise InvalidInput(_("A cluster name has at most 63 characters."), field="name")


def register_cluster(wanted: ClusterSettings) -> tuple[Cluster, bool]:
    """Add a cluster, or change the settings of one; returns (cluster, created).

    The kubeconfig is stored encrypted. The cluster is read at the next sync tick; callers that want it
    read now call `sync_inventory` or `request_sync`.
    """
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().filter(name=wanted.name).first()
        check_cluster(wanted)
        created = cluster is None
        if created:
            cluster = Cluster(name=wanted.name, driver=wanted.driver)
        if wanted.in_cluster:
            cluster.set_kubeconfig("")
        elif wanted.kubeconfig is not None:
            cluster.set_kubeconfig(wanted.kubeconfig)
        cluster.context = wanted.context
        cluster.in_cluster = wanted.in_cluster
        if wanted.mig_config_map:
            cluster.mig_config_map = wanted.mig_config_map
        if wanted.prometheus_url is not None:
            cluster.prometheus_url = wanted.prometheus_url
        cluster.next_sync_at = None  # try the new settings at the next tick
        try:
            with transaction.atomic():
                cluster.save()
        except IntegrityError as error:  # registered by someone else in the meantime
            raise InvalidInput(
                _("Cluster %(name)s was registered at the same moment; try again.") % {"name": wanted.name}
            ) from error
    return cluster, created


def _run_queue_if_undrained(drained: bool) -> None:
    if not drained:  # capacity is back: waiting requests may fit now
        dispatch.after_commit(dispatch.ADMIT)


GPU_DRAINED = gettext_noop("GPU %(index)s of node %(node)s drained")
GPU_UNDRAINED = gettext_noop("GPU %(index)s of node %(node)s undrained")
GPU_FAULT_DRAINED = gettext_noop("GPU %(index)s of node %(node)s drained after a fault (%(fault)s)")
NODE_DRAINED = gettext_noop("Node %(node)s drained")
NODE_UNDRAINED = gettext_noop("Node %(node)s undrained")


def set_gpu_drained(*, gpu: GpuCapacity, drained: bool, actor=None, fault: str = "") -> GpuCapacity:
    """A drained GPU gets no new work; what runs on it stays. `fault` names the fault that drains it."""
    with transaction.atomic():
        gpu = GpuCapacity.objects.select_for_update().select_related("node").get(pk=gpu.pk)
        if gpu.drained != drained:
            gpu.drained = drained
            gpu.save(update_fields=["drained", "last_change_at"])
            summary = (GPU_FAULT_DRAINED if fault else GPU_DRAINED) if drained else GPU_UNDRAINED
            audit.record(
                "gpu.drained" if drained else "gpu.undrained",
                summary=summary,
                values={"index": gpu.index, "node": gpu.node.name, "fault": fault},
                actor=actor,
                subject=("gpu", gpu.pk),
                details={"node": gpu.node_id, "uuid": gpu.uuid, **({"fault": fault} if fault else {})},
            )
            capacity_version.changed()
            _run_queue_if_undrained(drained)
    return gpu


def set_node_drained(*, node: NodeCapacity, drained: bool, actor=None) -> NodeCapacity:
    with transaction.atomic():
        node = NodeCapacity.objects.select_for_update().get(pk=node.pk)
        if node.drained != drained:
            node.drained = drained
            node.save(update_fields=["drained", "last_change_at"])
            audit.record(
                "node.drained" if drained else "node.undrained",
                summary=NODE_DRAINED if drained else NODE_UNDRAINED,
                values={"node": node.name},
                actor=actor,
                subject=("node", node.pk),
                details={"cluster": node.cluster_id},
            )
            capacity_version.changed()
            _run_queue_if_undrained(drained)
    return node


def bind_instance_uuids(*, gpu: GpuCapacity, uuids: dict[int, str]) -> int:
    """Name the MIG instance behind each live allocation of `gpu`, by the instance's first memory slice
    ({start: UUID}, as a node reports them), so that what a device reports can be told to its pool.
    Returns how many allocations changed."""
    changed = 0
    with transaction.atomic():
        for allocation in Allocation.objects.select_for_update().filter(gpu=gpu, released_at__isnull=True):
            uuid = uuids.get(allocation.slices.lower, "")
            if uuid and allocation.instance_uuid != uuid:
                allocation.instance_uuid = uuid
                allocation.save(update_fields=["instance_uuid"])
                changed += 1
    return changed


def set_node_group(*, node: NodeCapacity, group: GpuGroup | None) -> NodeCapacity:
    """Put a node into a group of its own cluster (or none); a node is in at most one group."""
    if group is not None and group.cluster_id != node.cluster_id:
        raise InvalidInput(
            _("Group %(group)s belongs to another cluster than node %(node)s.")
            % {"group": group, "node": node}
        )
    with transaction.atomic():
        node = NodeCapacity.objects.select_for_update().get(pk=node.pk)
        node.group = group
        node.save(update_fields=["group", "last_change_at"])
        capacity_version.changed()
    return node
