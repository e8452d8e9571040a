"""Capacity changes people make: registering clusters, draining, grouping.

Views, the API, admin actions and commands call these; each runs in one
transaction, locks what it changes and refuses bad input with a PortalError.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import capacity_version, task_names
from pools.kubeconfig import check_kubeconfig
from pools.models import Allocation, Cluster, GpuCapacity, GpuGroup, NodeCapacity
from portal import audit, dispatch
from portal.errors import InvalidInput
from portal.models import dns_label_validator


@dataclass(frozen=True)
class ClusterSettings:
    """What an operator gives to register a cluster or change it. `kubeconfig=None` keeps the one stored
    for a cluster of that name (checked again, since the context may change); text replaces it."""

    name: str
    driver: str = Cluster.Driver.KUBERNETES
    kubeconfig: str | None = None
    context: str = ""
    in_cluster: bool = False
    mig_config_map: str = ""  # "" keeps the stored one (the default for a new cluster)
    device_plugin_config_map: str = ""  # the same
    # The cluster's Prometheus (scraping dcgm-exporter) that GPU figures are read from; None keeps the
    # stored one, "" clears it. A user:password@ in it is its credential, stored encrypted apart from the
    # address; an address without one keeps the stored credential while it names the same server
    # (scheme, host and port), and drops it for another.
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
    if wanted.device_plugin_config_map and wanted.device_plugin_config_map.count("/") != 1:
        raise InvalidInput(
            _(
                "The device plugin config map is given as namespace/name, e.g. "
                "gpu-operator/gpu-portal-device-plugin."
            ),
            field="device_plugin_config_map",
        )
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
        if all(e.code == "outbound_address" for e in error.error_list):  # an address, but one refused
            message = " ".join(error.messages)
        else:
            message = _(
                "The Prometheus URL is an http or https address, e.g. http://prometheus.monitoring:9090."
            )
        raise InvalidInput(message, field="prometheus_url") from error
    url, _credential = split_credential(url)
    if len(url) > field.max_length:
        raise InvalidInput(
            _("A Prometheus URL has at most %(max)s characters.") % {"max": field.max_length},
            field="prometheus_url",
        )


def split_credential(url: str) -> tuple[str, str]:
    """`url` without its user part, and that part ("user:password" as written; "" when there is none)."""
    parts = urlsplit(url)
    credential, at, server = parts.netloc.rpartition("@")
    if not at:
        return url, ""
    return urlunsplit(parts._replace(netloc=server)), credential


def _same_server(url: str, other: str) -> bool:
    first, second = urlsplit(url), urlsplit(other)
    return (first.scheme, first.hostname, first.port) == (second.scheme, second.hostname, second.port)


def _set_prometheus_url(cluster: Cluster, given: str) -> None:
    url, credential = split_credential(given)
    if credential or not url or not _same_server(url, cluster.prometheus_url):
        cluster.set_prometheus_credential(credential)
    cluster.prometheus_url = url


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

    The kubeconfig and the Prometheus credential are stored encrypted. The cluster is read at the next sync
    tick; callers that want it read now call `sync_inventory` or `request_sync`.
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
        if wanted.device_plugin_config_map:
            cluster.device_plugin_config_map = wanted.device_plugin_config_map
        if wanted.prometheus_url is not None:
            _set_prometheus_url(cluster, wanted.prometheus_url)
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
        dispatch.after_commit(task_names.ADMIT)


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
