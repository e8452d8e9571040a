"""Capacity: the portal's picture of each cluster's nodes, GPUs and MIG stock.

- Cluster: a Kubernetes cluster (or a simulated one) the portal places pools on.
- GpuGroup: nodes of one cluster grouped by workload type (training, inference, …), and the kinds of GPU
  unit it offers (whole GPUs, MIG instances, shares: pools/kinds/).
- NodeCapacity: one node's GPU totals, MIG manager state, share mode and drain flag.
- GpuCapacity: one physical GPU: model, UUID, memory, MIG mode and layout, health.
- SpecAndCount: one provisioned resource on a node (a MIG profile or full GPUs) and
  how many exist, are allocatable, and are allocated to pools.
- WorkloadProfile: a pod holding GPU resources, for workload tracking: the devices it uses through claims.
- Trespass: a GPU in use by a namespace that holds no allocation on it, as a sync saw it, until it ends.

These rows are written by the inventory sync (`pools/services/inventory.py`) from what the cluster's
driver reports; rows that vanish from the cluster are marked absent, never deleted,
so their history stays.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.translation import gettext, pgettext_lazy
from django.utils.translation import gettext_lazy as _

from pools import kinds, mig, secrets
from pools.conf import settings
from portal.models import DNS_LABEL_PATTERN, dns_label_validator
from portal.outbound import validate_outbound_url


class Cluster(models.Model):
    class Driver(models.TextChoices):
        KUBERNETES = "kubernetes", _("Kubernetes")
        SIMULATED = "simulated", _("Simulated")

    class Binding(models.TextChoices):
        """How the cluster can bind a pool's GPUs to its namespace: exact devices through Dynamic Resource
        Allocation, or counts of the device plugin's resources."""

        DRA = "dra", _("DRA")
        DEVICE_PLUGIN = "device-plugin", _("device plugin")

    class Status(models.TextChoices):
        NEW = "new", _("new")
        READY = "ready", _("ready")
        UNREACHABLE = "unreachable", _("unreachable")
        UNAUTHORISED = "unauthorised", _("unauthorised")
        ERROR = "error", _("error")

    name = models.CharField(_("name"), max_length=63, unique=True, validators=[dns_label_validator])
    driver = models.CharField(_("driver"), max_length=16, choices=Driver.choices)
    binding = models.CharField(
        _("binding"), max_length=16, choices=Binding.choices, default=Binding.DEVICE_PLUGIN, editable=False
    )
    # Why the cluster binds through the device plugin (what its last sync found), for the operators.
    binding_note = models.CharField(_("why not DRA"), max_length=300, blank=True, editable=False)
    # Why the portal's admission policy is not in force there ("" when it is), as the last sync found.
    admission_note = models.CharField(_("admission policy"), max_length=500, blank=True, editable=False)
    # A kubeconfig holds credentials: stored encrypted, never shown back, never logged.
    kubeconfig_encrypted = models.TextField(blank=True, editable=False)
    context = models.CharField(_("kubeconfig context"), max_length=253, blank=True)
    in_cluster = models.BooleanField(
        _("in-cluster credentials"),
        default=False,
        help_text=_("Use the service account of the pod the portal runs in instead of a kubeconfig."),
    )
    mig_config_map = models.CharField(
        _("MIG config map"),
        max_length=253,
        default="gpu-operator/custom-mig-parted-config",
        help_text=_("namespace/name of the mig-parted ConfigMap the GPU Operator is told to use."),
    )
    device_plugin_config_map = models.CharField(
        _("device plugin config map"),
        max_length=253,
        default="gpu-operator/gpu-portal-device-plugin",
        help_text=_(
            "namespace/name of the device plugin's ConfigMap the GPU Operator is told to use (its "
            "ClusterPolicy's devicePlugin.config.name); the portal writes its time-slicing and MPS configs "
            "there."
        ),
    )
    prometheus_url = models.URLField(
        _("Prometheus URL"),
        blank=True,
        validators=[URLValidator(schemes=["http", "https"]), validate_outbound_url],
        help_text=_(
            "The cluster's Prometheus that scrapes the GPU Operator's dcgm-exporter, e.g. "
            "http://prometheus.monitoring:9090. GPU figures are read from it; leave empty when node agents "
            "push them instead. A user:password@ in the address is stored encrypted, apart from it, and "
            "never shown again; the address given without one keeps it while it names the same server."
        ),
    )
    # The user:password of the Prometheus URL (basic auth), as written there: stored encrypted like the
    # kubeconfig, never shown back; `prometheus_url` holds the address without it.
    prometheus_credential_encrypted = models.TextField(blank=True, editable=False)
    status = models.CharField(_("status"), max_length=16, choices=Status.choices, default=Status.NEW)
    last_sync_at = models.DateTimeField(_("last sync"), null=True, blank=True)
    last_change_at = models.DateTimeField(_("last change"), null=True, blank=True)
    last_error = models.TextField(_("last error"), blank=True)
    failures = models.PositiveIntegerField(_("failed syncs in a row"), default=0)
    next_sync_at = models.DateTimeField(_("next sync"), null=True, blank=True)
    # Where the sync follows each of the cluster's streams from (pools/drivers/base.py: Versions), as the
    # driver gave them: written with what a sync changes, and at least every SYNC_HEARTBEAT_SECONDS.
    watch_versions = models.JSONField(_("watched from"), default=dict, blank=True, editable=False)
    # When the sync last listed the cluster whole; it does again after CAPACITY_RELIST_SECONDS.
    listed_at = models.DateTimeField(_("last listed"), null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        ordering = ["name"]
        verbose_name = _("cluster")
        verbose_name_plural = _("clusters")
        constraints = [
            models.CheckConstraint(
                condition=models.Q(name__regex=DNS_LABEL_PATTERN), name="cluster_name_dns_label"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def has_kubeconfig(self) -> bool:
        return bool(self.kubeconfig_encrypted)

    def set_kubeconfig(self, text: str) -> None:
        self.kubeconfig_encrypted = secrets.encrypt(text) if text else ""

    def kubeconfig(self) -> str:
        return secrets.decrypt(self.kubeconfig_encrypted) if self.kubeconfig_encrypted else ""

    @property
    def has_prometheus_credential(self) -> bool:
        return bool(self.prometheus_credential_encrypted)

    def set_prometheus_credential(self, userinfo: str) -> None:
        """`userinfo` is the user:password of a URL, as written there ("" forgets the stored one)."""
        self.prometheus_credential_encrypted = secrets.encrypt(userinfo) if userinfo else ""

    def prometheus_credential(self) -> str:
        if not self.prometheus_credential_encrypted:
            return ""
        return secrets.decrypt(self.prometheus_credential_encrypted, what="Prometheus credential")

    def prometheus_read_url(self) -> str:
        """The Prometheus URL with its stored credential as its user part, for the collector alone: never
        shown, never logged."""
        credential = self.prometheus_credential()
        if not credential or not self.prometheus_url:
            return self.prometheus_url
        parts = urlsplit(self.prometheus_url)
        return urlunsplit(parts._replace(netloc=f"{credential}@{parts.netloc}"))

    @property
    def mig_config_map_ref(self) -> tuple[str, str]:
        namespace, _slash, name = self.mig_config_map.partition("/")
        return namespace, name

    @property
    def device_plugin_config_map_ref(self) -> tuple[str, str]:
        namespace, _slash, name = self.device_plugin_config_map.partition("/")
        return namespace, name


def default_offers() -> list[str]:
    return list(kinds.DEFAULT_OFFERS)


def validate_offers(value: object) -> None:
    try:
        kinds.parse_offers(value)
    except ValueError as error:
        raise ValidationError(
            _('%(why)s Write them as a list, e.g. ["whole", "mig", "ts-4"].') % {"why": error},
            code="offers",
        ) from None


class GpuGroup(models.Model):
    """Nodes of a cluster set aside for one workload type; a node is in at most one group."""

    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="groups", verbose_name=_("cluster")
    )
    name = models.CharField(
        _("name"),
        max_length=40,
        validators=[dns_label_validator],
        help_text=_(
            "The workload type requests name as their purpose, e.g. training, inference, development."
        ),
    )
    description = models.CharField(_("description"), max_length=200, blank=True)
    offers = models.JSONField(
        _("offers"),
        default=default_offers,
        validators=[validate_offers],
        help_text=_(
            'What the group gives out, e.g. ["whole", "mig", "ts-4"]: whole GPUs, MIG instances, and shares '
            "of a GPU, ts-N time-sliced or mps-N under MPS, N from 2 to 8."
        ),
    )

    class Meta:
        ordering = ["cluster__name", "name"]
        verbose_name = _("GPU group")
        verbose_name_plural = _("GPU groups")
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="gpu_group_unique_in_cluster")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    def offer_labels(self) -> list[str]:
        """What the group offers, as people read it: "whole GPU", "time-sliced share (ts-4: 4 per GPU)"."""
        labels = []
        for offer in self.offers if isinstance(self.offers, list) else ():
            if offer in (kinds.WHOLE.name, kinds.MIG.name):
                labels.append(gettext(kinds.kind_named(offer).label))
                continue
            try:
                kind = kinds.share_kind(offer)
                labels.append(
                    gettext("%(kind)s (%(offer)s: %(count)s per GPU)")
                    % {"kind": gettext(kind.label), "offer": offer, "count": kind.replicas(offer)}
                )
            except ValueError:
                labels.append(str(offer))
        return labels


# The MIG manager's states (pools.mig.MigState, a pure enum) as people read them.
MIG_STATE_LABELS = {
    mig.MigState.PENDING: pgettext_lazy("MIG manager state", "pending"),
    mig.MigState.REBOOTING: pgettext_lazy("MIG manager state", "rebooting"),
    mig.MigState.SUCCESS: pgettext_lazy("MIG manager state", "applied"),
    mig.MigState.FAILED: pgettext_lazy("MIG manager state", "failed"),
    mig.MigState.UNKNOWN: pgettext_lazy("MIG manager state", "unknown"),
}


class Health(models.TextChoices):
    OK = "ok", _("healthy")
    DEGRADED = "degraded", _("degraded")
    FAILED = "failed", _("failed")
    UNKNOWN = "unknown", _("unknown")


class NodeCapacity(models.Model):
    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="nodes", verbose_name=_("cluster")
    )
    name = models.CharField(_("name"), max_length=253)
    group = models.ForeignKey(
        GpuGroup,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="nodes",
        verbose_name=_("GPU group"),
    )
    gpu_model = models.CharField(_("GPU model"), max_length=32, blank=True)
    gpu_count = models.PositiveSmallIntegerField(_("GPUs"), default=0)
    ready = models.BooleanField(_("ready"), default=True)
    mig_strategy = models.CharField(_("MIG strategy"), max_length=16, blank=True)
    mig_config = models.CharField(_("MIG config"), max_length=253, blank=True)
    mig_state = models.CharField(_("MIG state"), max_length=16, blank=True)
    mig_state_since = models.DateTimeField(_("MIG state since"), null=True, blank=True)
    sharing = models.CharField(
        _("sharing"),
        max_length=16,
        blank=True,
        help_text=_(
            "The share profile the node's MIG-off GPUs are advertised as (e.g. ts-4), as the last sync read "
            "it; empty when they are not shared."
        ),
    )
    sharing_config = models.CharField(
        _("device plugin config"),
        max_length=253,
        blank=True,
        help_text=_("The device plugin config the node's nvidia.com/device-plugin.config label asked for."),
    )
    drained = models.BooleanField(_("drained"), default=False)
    present = models.BooleanField(
        _("present"), default=True, help_text=_("False once the node left the cluster.")
    )
    error = models.TextField(_("inventory error"), blank=True)
    first_seen_at = models.DateTimeField(_("first seen"), auto_now_add=True)
    last_change_at = models.DateTimeField(_("last change"), auto_now=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        verbose_name = _("node capacity")
        verbose_name_plural = _("node capacities")
        constraints = [models.UniqueConstraint(fields=["cluster", "name"], name="node_unique_in_cluster")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.name}"

    def get_mig_state_display(self) -> str:
        return str(MIG_STATE_LABELS.get(self.mig_state, self.mig_state))

    @property
    def mig_stuck(self) -> bool:
        """A MIG change pending longer than MIG_PENDING_TIMEOUT_SECONDS: the known wedge."""
        if self.mig_state not in mig.MIG_CHANGING or self.mig_state_since is None:
            return False
        waited = (timezone.now() - self.mig_state_since).total_seconds()
        return waited > settings.MIG_PENDING_TIMEOUT_SECONDS


class GpuCapacity(models.Model):
    node = models.ForeignKey(
        NodeCapacity, on_delete=models.CASCADE, related_name="gpus", verbose_name=_("node")
    )
    index = models.PositiveSmallIntegerField(_("index"))
    uuid = models.CharField(_("UUID"), max_length=64, blank=True)
    model = models.CharField(_("model"), max_length=32)
    memory_mib = models.PositiveIntegerField(_("memory (MiB)"), default=0)
    mig_capable = models.BooleanField(_("MIG capable"), default=False)
    mig_enabled = models.BooleanField(_("MIG enabled"), default=False)
    # [{"profile": "1g.18gb", "start": 0, "uuid": "MIG-…"}, …] sorted by start; empty when MIG is off.
    layout = models.JSONField(_("MIG layout"), default=list, blank=True)
    # The layout the queue planned for this GPU when it admitted a pool, until the cluster reports it:
    # {"mig": bool, "instances": [{"profile", "start"}]}. Placement sees this instead of `layout`.
    planned_layout = models.JSONField(_("planned MIG layout"), null=True, blank=True)
    health = models.CharField(_("health"), max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    drained = models.BooleanField(_("drained"), default=False)
    present = models.BooleanField(_("present"), default=True)
    last_change_at = models.DateTimeField(_("last change"), auto_now=True)

    class Meta:
        ordering = ["node__cluster__name", "node__name", "index"]
        verbose_name = _("GPU capacity")
        verbose_name_plural = _("GPU capacities")
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_on_node")]
        indexes = [
            # The few GPUs an operator should look at (unhealthy or drained), by node: the capacity overview
            # lists their nodes first, the fleet page filters them, without reading every GPU.
            models.Index(
                fields=["node"],
                condition=~models.Q(health=Health.OK) | models.Q(drained=True),
                name="gpu_to_look_at",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.node}/{self.index}"

    @cached_property
    def compute(self) -> tuple[int, int]:
        """(compute slices provisioned as instances, compute slices stranded); a full GPU is all seven."""
        if not self.mig_enabled:
            return mig.COMPUTE_SLICES, 0
        try:
            model = mig.gpu_model(self.model)
            instances = [mig.Instance(i["start"], i["profile"]) for i in self.layout]
            return mig.used_compute_slices(model, instances), mig.stranded_compute_slices(model, instances)
        except ValueError:  # a model or layout the catalogue does not know: count nothing rather than guess
            return 0, 0

    @property
    def schedulable(self) -> bool:
        """Whether new work may land here: present, healthy and not drained (itself or its node)."""
        return self.present and self.health == Health.OK and not self.drained and not self.node.drained


class SpecAndCount(models.Model):
    """How many of one resource a node has: exist (capacity), allocatable, and allocated to pools."""

    node = models.ForeignKey(
        NodeCapacity, on_delete=models.CASCADE, related_name="specs", verbose_name=_("node")
    )
    resource_name = models.CharField(_("resource"), max_length=64)
    profile = models.CharField(
        _("profile"), max_length=32, help_text=_("A MIG profile, full, or a share profile such as ts-4.")
    )
    capacity = models.PositiveIntegerField(_("exist"), default=0)
    allocatable = models.PositiveIntegerField(_("allocatable"), default=0)
    allocated = models.PositiveIntegerField(_("allocated to pools"), default=0)
    last_change_at = models.DateTimeField(_("last change"), auto_now=True)

    class Meta:
        ordering = ["node__cluster__name", "node__name", "resource_name"]
        verbose_name = _("spec and count")
        verbose_name_plural = _("specs and counts")
        constraints = [
            models.UniqueConstraint(fields=["node", "resource_name"], name="spec_unique_on_node"),
        ]

    def __str__(self) -> str:
        return f"{self.node}: {self.resource_name} × {self.capacity}"


class WorkloadProfile(models.Model):
    """A pod that holds GPU resources, as last seen in its cluster."""

    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="workloads", verbose_name=_("cluster")
    )
    namespace = models.CharField(_("namespace"), max_length=63)
    pod_name = models.CharField(_("pod"), max_length=253)
    node_name = models.CharField(_("node"), max_length=253, blank=True)
    resource_name = models.CharField(_("resource"), max_length=64)
    count = models.PositiveIntegerField(_("count"))
    phase = models.CharField(_("phase"), max_length=16)
    project = models.ForeignKey(
        "portal.Project",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="workloads",
        verbose_name=_("project"),
    )
    # The UUIDs of the devices the pod uses through its ResourceClaims (DRA), on its claims' row: the one
    # whose resource_name is "" and count the number of those devices.
    devices = models.JSONField(_("devices"), default=list, blank=True)
    present = models.BooleanField(_("present"), default=True)
    first_seen_at = models.DateTimeField(_("first seen"), auto_now_add=True)
    # Refreshed when the row changes, and otherwise only every SYNC_HEARTBEAT_SECONDS, so that
    # a sync that finds nothing new writes nothing.
    last_seen_at = models.DateTimeField(_("last seen"))

    class Meta:
        ordering = ["cluster__name", "namespace", "pod_name"]
        verbose_name = _("workload")
        verbose_name_plural = _("workloads")
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "namespace", "pod_name", "resource_name"], name="workload_resource_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod_name}: {self.resource_name} × {self.count}"


class Trespass(models.Model):
    """A GPU in use by a namespace that holds no allocation on it, from the sync that first saw it to the
    one that saw it gone: pods asking a node for more of a resource than their namespace holds there, or
    a claim allocated a device that no live allocation of its namespace holds."""

    cluster = models.ForeignKey(
        Cluster, on_delete=models.CASCADE, related_name="trespasses", verbose_name=_("cluster")
    )
    node = models.ForeignKey(
        NodeCapacity,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="trespasses",
        verbose_name=_("node"),
    )
    namespace = models.CharField(_("namespace"), max_length=63)
    # What uses it: pods, or a claim, as "pod a, pod b" or "claim c" (shortened to fit).
    users = models.CharField(_("used by"), max_length=500)
    resource_name = models.CharField(_("resource"), max_length=64, blank=True)  # device plugin: the resource
    count = models.PositiveIntegerField(_("count"), default=1)  # of the resource, beyond what is held
    device_uuid = models.CharField(_("device UUID"), max_length=64, blank=True)  # DRA: the device
    # The pool whose device it is, where the device is known (DRA).
    pool = models.ForeignKey(
        "pools.Pool",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="trespasses",
        verbose_name=_("pool"),
    )
    first_seen_at = models.DateTimeField(_("first seen"))
    last_seen_at = models.DateTimeField(_("last seen"))
    ended_at = models.DateTimeField(_("ended"), null=True, blank=True)

    class Meta:
        ordering = ["-first_seen_at", "-pk"]
        verbose_name = _("trespass")
        verbose_name_plural = _("trespasses")
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "namespace", "node", "resource_name", "device_uuid"],
                condition=models.Q(ended_at__isnull=True),
                name="trespass_open_unique",
            ),
        ]
        indexes = [models.Index(fields=["cluster", "ended_at"], name="trespass_open")]

    def __str__(self) -> str:
        what = self.device_uuid or f"{self.resource_name} × {self.count}"
        return f"{self.namespace}: {what}"


__all__ = [
    "Cluster",
    "GpuCapacity",
    "GpuGroup",
    "Health",
    "NodeCapacity",
    "SpecAndCount",
    "Trespass",
    "WorkloadProfile",
]
