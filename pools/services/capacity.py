"""Capacity changes people make: registering clusters, draining, grouping.

Views, the API, admin actions and commands call these; each runs in one
transaction, locks what it changes and refuses bad input with a PortalError.
"""

from __future__ import annotations

import yaml
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils.translation import gettext as _

from pools.models import Cluster, GpuCapacity, GpuGroup, NodeCapacity
from portal.errors import InvalidInput
from portal.models import dns_label_validator


def check_kubeconfig(text: str, context: str) -> None:
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise InvalidInput(_("The kubeconfig is not valid YAML.")) from error
    if not isinstance(config, dict) or not config.get("clusters") or not config.get("contexts"):
        raise InvalidInput(_("The kubeconfig has no clusters or no contexts."))
    names = {c.get("name") for c in config["contexts"] if isinstance(c, dict)}
    if context and context not in names:
        raise InvalidInput(
            _("The kubeconfig has no context %(context)s (it has: %(names)s).")
            % {"context": context, "names": ", ".join(sorted(n for n in names if n))}
        )
    if not context and not config.get("current-context"):
        raise InvalidInput(_("The kubeconfig names no current context; choose one."))


def register_kubernetes_cluster(
    *, name: str, kubeconfig: str = "", context: str = "", in_cluster: bool = False, mig_config_map: str = ""
) -> tuple[Cluster, bool]:
    """Add or update a Kubernetes cluster; returns (cluster, created). The kubeconfig is stored encrypted."""
    try:
        dns_label_validator(name)
    except ValidationError as error:
        raise InvalidInput(
            _("Cluster name %(name)s: %(why)s") % {"name": name, "why": " ".join(error.messages)}
        ) from error
    if len(name) > 63:
        raise InvalidInput(_("A cluster name has at most 63 characters."))
    if not in_cluster:
        check_kubeconfig(kubeconfig, context)
    if mig_config_map and mig_config_map.count("/") != 1:
        raise InvalidInput(_("The MIG config map is given as namespace/name."))
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().filter(name=name).first()
        created = cluster is None
        if created:
            cluster = Cluster(name=name, driver=Cluster.Driver.KUBERNETES)
        elif cluster.driver != Cluster.Driver.KUBERNETES:
            raise InvalidInput(
                _("%(name)s is a %(driver)s cluster.") % {"name": name, "driver": cluster.driver}
            )
        cluster.set_kubeconfig("" if in_cluster else kubeconfig)
        cluster.context = context
        cluster.in_cluster = in_cluster
        if mig_config_map:
            cluster.mig_config_map = mig_config_map
        cluster.next_sync_at = None  # try the new settings at the next tick
        cluster.save()
    return cluster, created


def _run_queue_if_undrained(drained: bool) -> None:
    if not drained:  # capacity is back: waiting requests may fit now
        from pools.tasks import admit_waiting_requests

        transaction.on_commit(admit_waiting_requests.delay)


def set_gpu_drained(*, gpu: GpuCapacity, drained: bool) -> GpuCapacity:
    """A drained GPU gets no new work; what runs on it stays."""
    with transaction.atomic():
        gpu = GpuCapacity.objects.select_for_update().get(pk=gpu.pk)
        if gpu.drained != drained:
            gpu.drained = drained
            gpu.save(update_fields=["drained", "last_change_at"])
            _run_queue_if_undrained(drained)
    return gpu


def set_node_drained(*, node: NodeCapacity, drained: bool) -> NodeCapacity:
    with transaction.atomic():
        node = NodeCapacity.objects.select_for_update().get(pk=node.pk)
        if node.drained != drained:
            node.drained = drained
            node.save(update_fields=["drained", "last_change_at"])
            _run_queue_if_undrained(drained)
    return node


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
    return node
