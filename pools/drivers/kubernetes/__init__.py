"""KubernetesDriver: a real cluster through the official client and the NVIDIA GPU Operator.

Nodes and pods are listed in pages and then followed by watch, as Kubernetes controllers follow them: what
is read of each is in `reading.py` (inventory from the labels and resources that GPU feature discovery and
the device plugin put on nodes, per-GPU layouts from the mig-parted config a node's `nvidia.com/mig.config`
label names), and the watches' threads are in `watching.py`. The portal writes one mig-parted config per
node and change, with one entry per device, so GPUs it does not touch keep their layout (mig-parted skips
them). Shares of MIG-off GPUs (time-sliced, MPS) follow the device plugin config the node's
`nvidia.com/device-plugin.config` label names: the portal adds its configs, one per share mode
(pools/drivers/device_plugin.py), to the ConfigMap the plugin is told of. Under Dynamic Resource
Allocation, devices' UUIDs and the claims are read and written in `dra.py`; the admission policy is applied
in `policy.py`. A request an admission policy refuses is a DriverError in Kubernetes' words, not a
credentials problem.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import urllib3
import yaml
from django.utils.translation import gettext as _
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from pools import mig
from pools.drivers import admission, device_plugin
from pools.drivers.base import (
    CLAIMS,
    DEVICE_PLUGIN,
    DRA,
    NODES,
    PODS,
    QUOTA_NAME,
    SLICES,
    Binding,
    Change,
    ClaimChange,
    ClaimInfo,
    ClusterUnauthorised,
    ClusterUnreachable,
    DeviceClaim,
    DriverError,
    GpuLayout,
    MigStatus,
    NamespaceNotManaged,
    NodeChange,
    NodeInfo,
    Page,
    PodChange,
    PodInfo,
    Progress,
    SharingStatus,
    Versions,
    WatchItem,
    list_key,
    portal_manages,
    register,
    whole,
)
from pools.drivers.kubernetes import dra, reading, watching
from pools.drivers.kubernetes.dra import GPU_DRA_DRIVER, DraApi
from pools.drivers.kubernetes.policy import PolicyApi
from pools.drivers.kubernetes.reading import (
    ALL_DISABLED,
    GPU_NODE_SELECTOR,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    RUNNING_PODS,
    per_device,
)
from pools.gpu_models import model_from_node_labels, model_info
from pools.kubeconfig import check_kubeconfig
from pools.mig import MigState
from pools.models import Cluster
from portal.errors import InvalidInput

log = logging.getLogger(__name__)

CONFIG_KEY = "config.yaml"
PAGE = 500
LIST_RESTARTS = 3  # a list whose continue token expires is started again at most this many times
TIMEOUT = (5, 60)  # connect, read (seconds)
# Dynamic Resource Allocation's API (NVIDIA's DRA driver for GPUs publishes its devices as GPU_DRA_DRIVER).
DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
CONFLICT_RETRIES = 5
# How Kubernetes words a request an admission policy or webhook refused: a 403 that is not about credentials.
ADMISSION_DENIAL = " denied "


@contextmanager
def _translated_errors(action: str) -> Iterator[None]:
    """Client and network failures become DriverErrors an operator can read (never with credentials)."""
    try:
        yield
    except ApiException as error:
        if error.status == 403 and ADMISSION_DENIAL in _status_message(error):
            raise DriverError(f"{action}: {_status_message(error)}") from None
        if error.status in (401, 403):
            raise ClusterUnauthorised(
                f"{action}: the cluster refused our credentials ({error.status})."
            ) from None
        raise DriverError(f"{action}: {error.status} {error.reason}: {_status_message(error)}") from None
    except (urllib3.exceptions.HTTPError, OSError) as error:
        raise ClusterUnreachable(f"{action}: cannot reach the API server ({type(error).__name__}).") from None
    except ConfigException as error:
        raise DriverError(f"{action}: the kubeconfig cannot be used: {error}") from None
    except ValueError as error:  # a layout or a label the MIG catalogue refuses
        raise DriverError(f"{action}: {error}") from None


def _status_message(error: ApiException) -> str:
    try:
        return json.loads(error.body or "{}").get("message", "")
    except ValueError:
        return ""


@register("kubernetes")
class KubernetesDriver:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.config_namespace, self.config_name = cluster.mig_config_map_ref
        self.plugin_namespace, self.plugin_name = cluster.device_plugin_config_map_ref
        self._core: client.CoreV1Api | None = None
        self._dra: DraApi | None = None
        self._policy: PolicyApi | None = None
        self._binding: str | None = None  # as `binding` last found it
        self._sliced = False  # whether a watched node's change reads its slices
        self._configs: dict | None = None  # the mig-parted configs, read once per list or watch
        self._configs_asked: set[str] = set()

    @property
    def core(self) -> client.CoreV1Api:
        if self._core is None:
            with _translated_errors("connect"):
                if self.cluster.in_cluster:
                    configuration = client.Configuration()
                    config.load_incluster_config(client_configuration=configuration)
                    api_client = client.ApiClient(configuration)
                else:
                    api_client = config.new_client_from_config_dict(
                        self._stored_kubeconfig(), context=self.cluster.context or None
                    )
                api_client.configuration.retries = 1
                self._core = client.CoreV1Api(api_client)
        return self._core

    @property
    def dra(self) -> DraApi:
        if self._dra is None:
            self._dra = DraApi(self.core.api_client, TIMEOUT)
        return self._dra

    @property
    def policy(self) -> PolicyApi:
        if self._policy is None:
            self._policy = PolicyApi(self.core.api_client, TIMEOUT)
        return self._policy

    def _stored_kubeconfig(self) -> dict:
        """The stored kubeconfig, held to the rule it had to pass when it was given: a row saved
        before the rule, or written past it, never gets the client to run or read anything."""
        try:
            return check_kubeconfig(self.cluster.kubeconfig(), self.cluster.context)
        except InvalidInput as refused:
            raise DriverError(
                _("The stored kubeconfig is refused, so the cluster is not contacted: %(why)s")
                % {"why": refused.message}
            ) from None

    # --- reading: lists ---------------------------------------------------------------

    def _pages(self, call, **kwargs) -> Iterator[tuple[list[dict], str | None, str | None, str]]:
        """A list as JSON, page by page: (objects, the list key the page starts after, its last list key,
        the list's version). Pages of one list keep the version of its first; a list whose continue token
        expired mid-way (410) starts again (what it already gave is given again, harmlessly)."""
        for _attempt in range(LIST_RESTARTS):
            token, after, version = None, None, ""
            try:
                while True:
                    response = call(
                        limit=PAGE,
                        _continue=token,
                        _request_timeout=TIMEOUT,
                        _preload_content=False,
                        **kwargs,
                    )
                    page = json.loads(response.data)
                    metadata = page.get("metadata") or {}
                    items = page.get("items") or []
                    version = version or metadata.get("resourceVersion") or ""
                    token = metadata.get("continue")
                    last = (items[-1].get("metadata") or {}) if items else None
                    upto = (
                        (list_key(last.get("namespace") or "", last["name"]) if last else after)
                        if token
                        else None
                    )
                    yield items, after, upto, version
                    if not token:
                        return
                    after = upto
            except ApiException as error:
                if error.status != 410 or token is None:
                    raise
        raise DriverError(_("The cluster's list kept expiring while the portal read it; try again."))

    def _mig_configs(self) -> dict:
        try:
            configmap = self.core.read_namespaced_config_map(
                self.config_name, self.config_namespace, _request_timeout=TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:
                return {}
            raise
        try:
            document = yaml.safe_load((configmap.data or {}).get(CONFIG_KEY) or "") or {}
        except yaml.YAMLError:
            raise DriverError(f"{self.cluster.mig_config_map}: {CONFIG_KEY} is not valid YAML") from None
        configs = document.get("mig-configs") if isinstance(document, dict) else None
        return configs if isinstance(configs, dict) else {}

    def _read_node(self, node: dict, devices: dra.NodeDevices | None) -> NodeInfo:
        """A node's JSON as the portal reads it, with its devices' UUIDs. The mig-parted configs are read
        once per list or watch, and again when a node names one they lack (the portal adds one per change)."""
        if self._configs is None:
            self._configs = self._mig_configs()
        if (name := reading.config_needed(node, self._configs)) and name not in self._configs_asked:
            self._configs_asked.add(name)
            self._configs = self._mig_configs()
        return dra.with_uuids(reading.node_info(node, self._configs, self.cluster.mig_config_map), devices)

    def list_nodes(self) -> Iterator[Page[NodeInfo]]:
        self._configs, self._configs_asked = None, set()
        with _translated_errors("list ResourceSlices"):
            devices, slices = self.dra.published_listed()
        with _translated_errors("list nodes"):
            for items, after, upto, version in self._pages(
                self.core.list_node, label_selector=GPU_NODE_SELECTOR
            ):
                infos = tuple(
                    self._read_node(node, devices.nodes.get(node["metadata"]["name"])) for node in items
                )
                yield Page(infos, after, upto, {NODES: version, **({SLICES: slices} if slices else {})})

    def list_pods(self) -> Iterator[Page[PodInfo]]:
        with _translated_errors("list pods"):
            for items, after, upto, version in self._pages(
                self.core.list_pod_for_all_namespaces, field_selector=RUNNING_PODS
            ):
                infos = tuple(info for info in map(reading.pod_info, items) if info is not None)
                yield Page(infos, after, upto, {PODS: version})

    def list_claims(self) -> Iterator[Page[ClaimInfo]]:
        with _translated_errors("list ResourceClaims"):
            found, version = self.dra.claims_listed()
        yield Page(tuple(found), None, None, {CLAIMS: version} if version else {})

    def inventory(self) -> list[NodeInfo]:
        return whole(self.list_nodes())

    def workloads(self) -> list[PodInfo]:
        return whole(self.list_pods())

    def claims(self) -> list[ClaimInfo]:
        return whole(self.list_claims())

    # --- reading: watches ------------------------------------------------------------

    def watch(self, since: Versions, *, seconds: float) -> Iterator[WatchItem]:
        """Follow the streams (`watching.py`); node and pod events are read here, a slice's as its node's
        (read again with its devices), a claim's with the pods of its namespace that use it."""
        resource = self.dra.resource
        calls = {
            NODES: (self.core.list_node, {"label_selector": GPU_NODE_SELECTOR}),
            PODS: (self.core.list_pod_for_all_namespaces, {"field_selector": RUNNING_PODS}),
            SLICES: (resource.list_resource_slice, {"field_selector": f"spec.driver={GPU_DRA_DRIVER}"}),
            CLAIMS: (resource.list_resource_claim_for_all_namespaces, {}),
        }
        streams = {stream: (*calls[stream], version) for stream, version in since.items() if stream in calls}
        self._configs, self._configs_asked = None, set()
        self._sliced = SLICES in streams and self._binding in (None, DRA)
        if not streams:
            return
        with _translated_errors("watch the cluster"):
            for item in watching.follow(streams, seconds):
                if isinstance(item, watching.Event):
                    yield from self._changes(item) or [Progress(item.stream, item.version)]
                else:
                    yield item

    def _changes(self, event: watching.Event) -> list[Change]:
        stream, version, obj = event.stream, event.version, event.obj
        metadata = obj.get("metadata") or {}
        if stream == NODES:
            if event.type == "DELETED" or not reading.is_gpu_node(obj):
                return [NodeChange(stream, version, metadata["name"], None)]
            devices = self.dra.node_devices(metadata["name"]) if self._sliced else None
            return [NodeChange(stream, version, metadata["name"], self._read_node(obj, devices))]
        if stream == PODS:
            pod = None if event.type == "DELETED" else reading.pod_info(obj)
            return [PodChange(stream, version, metadata.get("namespace") or "", metadata["name"], pod)]
        if stream == SLICES:
            name = (obj.get("spec") or {}).get("nodeName") or ""
            try:
                node = json.loads(
                    self.core.read_node(name, _request_timeout=TIMEOUT, _preload_content=False).data
                )
            except ApiException as error:
                if error.status == 404:
                    return []  # the node's own stream says it is gone
                raise
            if not reading.is_gpu_node(node):
                return []
            return [NodeChange(stream, version, name, self._read_node(node, self.dra.node_devices(name)))]
        namespace, name = metadata.get("namespace") or "", metadata["name"]
        users = [
            PodChange(stream, version, namespace, pod["metadata"]["name"], reading.pod_info(pod))
            for pod in self.dra.listed(self.core.list_namespaced_pod, namespace=namespace)[0]
            if name in reading.pod_claims(pod)
        ]
        return [ClaimChange(stream, version, namespace, name), *users]

    def binding(self) -> Binding:
        with _translated_errors("read the API groups"):
            groups = client.ApisApi(self.core.api_client).get_api_versions(_request_timeout=TIMEOUT).groups
        served = any(
            group.name == DRA_GROUP and any(v.version == DRA_VERSION for v in group.versions or [])
            for group in groups or []
        )
        if not served:
            why = _("The cluster does not serve %(api)s: Dynamic Resource Allocation needs Kubernetes 1.34.")
            return self._bound(Binding(DEVICE_PLUGIN, why % {"api": f"{DRA_GROUP}/{DRA_VERSION}"}))
        with _translated_errors("list ResourceSlices"):
            found = client.ResourceV1Api(self.core.api_client).list_resource_slice(
                field_selector=f"spec.driver={GPU_DRA_DRIVER}", limit=1, _request_timeout=TIMEOUT
            )
        if not found.items:
            why = _("The cluster serves DRA, but no GPU driver (%(driver)s) publishes ResourceSlices.")
            return self._bound(Binding(DEVICE_PLUGIN, why % {"driver": GPU_DRA_DRIVER}))
        return self._bound(Binding(DRA))

    def _bound(self, binding: Binding) -> Binding:
        """Kept for the watch: only under DRA does a node's change need its slices read."""
        self._binding = binding.mode
        return binding

    def ensure_admission_policy(self) -> str:
        with _translated_errors("apply the admission policy"):
            return self.policy.ensure()

    def mig_state(self, node: str) -> MigStatus:
        with _translated_errors(f"read node {node}"):
            labels = self.core.read_node(node, _request_timeout=TIMEOUT).metadata.labels or {}
        state = labels.get(MIG_STATE_LABEL, "")
        return MigStatus(
            config=labels.get(MIG_CONFIG_LABEL, ""),
            state=MigState(state) if state in MigState._value2member_map_ else MigState.UNKNOWN,
        )

    def sharing_state(self, node: str) -> SharingStatus:
        with _translated_errors(f"read node {node}"):
            labels = self._node_labels(node)
            return SharingStatus(
                config=labels.get(device_plugin.CONFIG_LABEL, ""),
                sharing=device_plugin.profile_of_labels(labels),
            )

    def _node_labels(self, node: str) -> dict[str, str]:
        try:
            return self.core.read_node(node, _request_timeout=TIMEOUT).metadata.labels or {}
        except ApiException as error:
            if error.status == 404:
                raise device_plugin.no_such_node(node) from None
            raise

    # --- changing ------------------------------------------------------------------------

    def apply_mig_layout(self, node: str, layout: Sequence[GpuLayout]) -> str:
        with _translated_errors(f"re-partition {node}"):
            labels = self.core.read_node(node, _request_timeout=TIMEOUT).metadata.labels or {}
            count = int(labels.get("nvidia.com/gpu.count", "0"))
            model = model_info(
                model_from_node_labels(
                    labels.get("nvidia.com/gpu.product", ""),
                    int(labels.get("nvidia.com/gpu.memory", "0")) or None,
                )
            )
            wanted = {gpu.index: gpu for gpu in layout}
            for gpu in layout:
                if not 0 <= gpu.index < count:
                    raise DriverError(f"{node} has no GPU {gpu.index}.")
                if gpu.mig_enabled:
                    mig.validate_layout(
                        model.geometry(), [mig.Instance(i.start, i.profile) for i in gpu.instances]
                    )
            name = self._write_config(node, labels.get(MIG_CONFIG_LABEL, ALL_DISABLED), count, wanted)
            # The manager may still show the previous config's "success" for a moment: mark the
            # new config pending ourselves so that nobody mistakes the old success for the new one.
            self.core.patch_node(
                node,
                {"metadata": {"labels": {MIG_CONFIG_LABEL: name, MIG_STATE_LABEL: MigState.PENDING.value}}},
                _request_timeout=TIMEOUT,
            )
        return name

    def apply_sharing(self, node: str, profile: str) -> str:
        device_plugin.check_profile(profile)
        with _translated_errors(f"share the GPUs of {node}"):
            labels = self._node_labels(node)
            if labels.get(MIG_STATE_LABEL, "") in mig.MIG_CHANGING:
                raise device_plugin.mig_change_pending(node)
            key = device_plugin.config_key(profile)
            self._write_sharing_config(key, device_plugin.config_text(profile))
            if labels.get(device_plugin.CONFIG_LABEL) != key:
                self.core.patch_node(
                    node,
                    {"metadata": {"labels": {device_plugin.CONFIG_LABEL: key}}},
                    _request_timeout=TIMEOUT,
                )
        return key

    def _write_sharing_config(self, key: str, text: str) -> None:
        """Put a config into the device plugin's ConfigMap when it is missing or different there, touching
        no other key (the operator's own configs may sit beside the portal's)."""
        for _attempt in range(CONFLICT_RETRIES):
            try:
                configmap = self.core.read_namespaced_config_map(
                    self.plugin_name, self.plugin_namespace, _request_timeout=TIMEOUT
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                configmap = None
            try:
                if configmap is None:
                    self.core.create_namespaced_config_map(
                        self.plugin_namespace,
                        client.V1ConfigMap(
                            metadata=client.V1ObjectMeta(name=self.plugin_name), data={key: text}
                        ),
                        _request_timeout=TIMEOUT,
                    )
                elif (configmap.data or {}).get(key) != text:
                    self.core.patch_namespaced_config_map(
                        self.plugin_name,
                        self.plugin_namespace,
                        {"data": {key: text}},
                        _request_timeout=TIMEOUT,
                    )
                return
            except ApiException as error:
                if error.status != 409:  # another worker created it first: read again
                    raise
        raise DriverError(
            _("%(config_map)s kept changing while the portal wrote to it; try again.")
            % {"config_map": self.cluster.device_plugin_config_map}
        )

    def _write_config(self, node: str, current: str, count: int, wanted: Mapping[int, GpuLayout]) -> str:
        """Add a per-device config for the node to the mig-parted ConfigMap; returns its name."""
        for _attempt in range(CONFLICT_RETRIES):
            try:
                configmap = self.core.read_namespaced_config_map(
                    self.config_name, self.config_namespace, _request_timeout=TIMEOUT
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                configmap = None
            document = (
                yaml.safe_load(((configmap.data or {}) if configmap else {}).get(CONFIG_KEY) or "") or {}
            )
            configs = document.setdefault("mig-configs", {})
            document.setdefault("version", "v1")
            before = per_device(configs[current], count) if current in configs else [(False, {})] * count
            entries = []
            for index in range(count):
                if index in wanted:
                    gpu = wanted[index]
                    enabled, devices = gpu.mig_enabled, gpu.profile_counts()
                else:
                    enabled, devices = before[index] or (False, {})
                entry = {"devices": [index], "mig-enabled": enabled}
                if enabled:
                    entry["mig-devices"] = dict(sorted(devices.items()))
                entries.append(entry)
            digest = hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()[:10]
            name = f"portal-{node}-{digest}"
            prefix = f"portal-{node}-"
            for stale in [k for k in configs if k.startswith(prefix) and k not in (name, current)]:
                del configs[stale]
            configs[name] = entries
            data = {CONFIG_KEY: yaml.safe_dump(document, sort_keys=True)}
            try:
                if configmap is None:
                    self.core.create_namespaced_config_map(
                        self.config_namespace,
                        client.V1ConfigMap(metadata=client.V1ObjectMeta(name=self.config_name), data=data),
                        _request_timeout=TIMEOUT,
                    )
                else:
                    configmap.data = data
                    self.core.replace_namespaced_config_map(
                        self.config_name, self.config_namespace, configmap, _request_timeout=TIMEOUT
                    )
                return name
            except ApiException as error:
                if error.status != 409:  # another node's change got in first: read again
                    raise
        raise DriverError(f"{self.cluster.mig_config_map} kept changing under us; try again.")

    def ensure_namespace(self, namespace: str, labels: Mapping[str, str]) -> None:
        with _translated_errors(f"create namespace {namespace}"):
            body = client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=dict(labels)))
            try:
                self.core.create_namespace(body, _request_timeout=TIMEOUT)
                return
            except ApiException as error:
                if error.status != 409:
                    raise
            # It exists: re-labelling is only for a namespace we created, never for someone else's.
            existing = self.core.read_namespace(namespace, _request_timeout=TIMEOUT)
            if not portal_manages(existing.metadata.labels):
                raise NamespaceNotManaged(namespace)
            self.core.patch_namespace(
                namespace, {"metadata": {"labels": dict(labels)}}, _request_timeout=TIMEOUT
            )

    def bind_namespace(self, namespace: str, binding: str, nodes: Sequence[str]) -> None:
        annotations = admission.namespace_annotations(binding, nodes)
        with _translated_errors(f"bind namespace {namespace}"):
            current = self.core.read_namespace(namespace, _request_timeout=TIMEOUT)
            if not portal_manages(current.metadata.labels):
                raise NamespaceNotManaged(namespace)
            if any((current.metadata.annotations or {}).get(k) != v for k, v in annotations.items()):
                self.core.patch_namespace(
                    namespace, {"metadata": {"annotations": annotations}}, _request_timeout=TIMEOUT
                )

    def apply_claims(self, namespace: str, pool: str, claims: Sequence[DeviceClaim]) -> None:
        with _translated_errors(f"set the ResourceClaims of pool {pool} in {namespace}"):
            self.dra.apply_claims(namespace, pool, claims)

    def apply_quota(self, namespace: str, resources: Mapping[str, int]) -> None:
        hard = {f"requests.{name}": str(count) for name, count in sorted(resources.items())}
        with _translated_errors(f"set the GPU quota of {namespace}"):
            body = client.V1ResourceQuota(
                metadata=client.V1ObjectMeta(
                    name=QUOTA_NAME, labels={"app.kubernetes.io/managed-by": "gpu-portal"}
                ),
                spec=client.V1ResourceQuotaSpec(hard=hard),
            )
            try:
                current = self.core.read_namespaced_resource_quota(
                    QUOTA_NAME, namespace, _request_timeout=TIMEOUT
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                self.core.create_namespaced_resource_quota(namespace, body, _request_timeout=TIMEOUT)
                return
            if (current.spec.hard or {}) != hard:
                body.metadata.resource_version = current.metadata.resource_version
                self.core.replace_namespaced_resource_quota(
                    QUOTA_NAME, namespace, body, _request_timeout=TIMEOUT
                )

    def remove_quota(self, namespace: str) -> None:
        with _translated_errors(f"remove the GPU quota of {namespace}"):
            try:
                self.core.delete_namespaced_resource_quota(QUOTA_NAME, namespace, _request_timeout=TIMEOUT)
            except ApiException as error:
                if error.status != 404:
                    raise
