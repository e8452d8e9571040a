"""A small Kubernetes API server (JSON over real HTTP) for tests and benchmarks of the portal.

It serves core v1, the API groups the portal's own manifests use (apps, batch, networking.k8s.io, policy,
rbac.authorization.k8s.io) and Dynamic Resource Allocation (resource.k8s.io/v1). The official `kubernetes`
client talks to it through a kubeconfig the server writes; tests arrange the cluster through the Python
control API (`add_gpu_node`, `add_namespace`, `set_mig_outcome`, ...) and assert on stored objects with
`get` and `objects`. The admin token may do anything; a token from `service_account_token` is authorized by
the RBAC objects stored in the server, and `grants` records which rule allowed each of its requests. Every
write over HTTP, the admin's too, passes the validating admission policies stored in the server
(admission.py), and `admission_audits` records what their Audit bindings saw; a SelfSubjectReview tells a
caller who it is. Node
MIG reconfiguration follows the GPU Operator's MIG manager (mig_manager.py) and GPU sharing its device
plugin (device_plugin.py), agreeing on a node's resources through gpu_resources.py; NVIDIA's DRA driver
publishes a node's GPUs and MIG devices as ResourceSlices (dra_driver.py) and claims are allocated as the
scheduler would (dra_allocation.py); the REST verbs are in rest.py, per-kind rules in kinds.py, RBAC in
rbac.py, the store and its history of changes in store.py. List paths answer `watch=true` with a stream of
events, as a real server does (watch.py); tests may `compact` the history, so that older versions and
continue tokens are answered 410 Expired, and `drop_watches` to cut every open stream.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import select
import socket
import threading
import traceback
from copy import deepcopy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from tests.kube import objects as build
from tests.kube.admission import Admission, AuditRecord, Review
from tests.kube.device_plugin import DevicePlugin
from tests.kube.device_plugin import config_name as device_plugin_config
from tests.kube.dra_allocation import ClaimAllocator
from tests.kube.dra_driver import DRIVER, GpuDraDriver, device_classes
from tests.kube.mig_manager import CONFIG_LABEL, GPU_PRESENT_LABEL, MigManager
from tests.kube.rbac import (
    AdminUser,
    Authorizer,
    Grant,
    RequestInfo,
    ServiceAccountUser,
    User,
    bootstrap_objects,
    request_info,
)
from tests.kube.rest import Reply, RestApi
from tests.kube.semantics import ApiError, status_body
from tests.kube.store import HISTORY_LIMIT, ClusterStore, resource_for
from tests.kube.watch import BOOKMARK_SECONDS, Dropped, Watch, Watches


class KubeApiServer:
    """The cluster tests talk to: start it, write a kubeconfig, arrange nodes and pods, assert."""

    def __init__(
        self,
        *,
        token: str = "test-token",
        mig_config_map: str = "gpu-operator/custom-mig-parted-config",
        device_plugin_config_map: str = "gpu-operator/gpu-portal-device-plugin",
        mig_apply_seconds: float = 0.05,
        stale_success_seconds: float = 0.0,
        watch_history: int = HISTORY_LIMIT,
        bookmark_seconds: float = BOOKMARK_SECONDS,
    ) -> None:
        self.token = token
        self.mig_config_map = mig_config_map
        self.device_plugin_config_map = device_plugin_config_map
        self.mig_apply_seconds = mig_apply_seconds
        self.stale_success_seconds = stale_success_seconds
        self.store = ClusterStore(history_limit=watch_history)
        self.lock = self.store.lock  # reentrant: a bulk loader may hold it around many control calls
        self.requests: list[tuple[str, str]] = []
        self.errors: list[str] = []  # tracebacks of requests that ended in an unexpected 500
        self.url = ""
        self._failures: list[int] = []
        self._http: ThreadingHTTPServer | None = None
        self._mig = MigManager(self)
        self._device_plugin = DevicePlugin(self)
        self._dra_driver = GpuDraDriver(self.store)
        self._claims = ClaimAllocator(self.store)
        self.watches = Watches(self.store, bookmark_seconds=bookmark_seconds)
        self._rest = RestApi(self.store, self.watches, on_node_write=self._node_written)
        self.patch_content_types = self._rest.patch_content_types  # what clients really send on PATCH
        self._authorizer = Authorizer(self.store)
        self._admission = Admission(self.store)
        self._service_account_tokens: dict[str, ServiceAccountUser] = {}
        for namespace in dict.fromkeys(
            ("default", mig_config_map.partition("/")[0], device_plugin_config_map.partition("/")[0])
        ):
            self.store.insert("Namespace", build.namespace(namespace))
        for obj in bootstrap_objects():
            self.store.insert(obj["kind"], obj)

    # --- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> KubeApiServer:
        http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        # Keep-alive handler threads may sit idle on a pooled connection; stop() must not wait for them.
        http.block_on_close = False
        http.request_queue_size = 128
        http.api = self  # type: ignore[attr-defined]
        self._http = http
        self.url = f"http://127.0.0.1:{http.server_address[1]}"
        self._rest.address = f"127.0.0.1:{http.server_address[1]}"
        threading.Thread(
            target=http.serve_forever, kwargs={"poll_interval": 0.02}, name="kube-api-server", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._mig.stop()
        self._device_plugin.stop()
        self.watches.drop_all(wait=2.0)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> KubeApiServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def write_kubeconfig(self, path: str | Path, *, token: str | None = None, context: str = "test") -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": self.token if token is None else token}}],
            "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
            "current-context": context,
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # --- control API ---------------------------------------------------------------------------------------

    def add_gpu_node(
        self,
        name: str,
        *,
        gpus: int = 8,
        product: str = "NVIDIA-H200",
        memory_mib: int = 143771,
        mig_capable: bool = True,
        labels: dict[str, str] | None = None,
    ) -> dict:
        node = build.gpu_node(
            name, gpus=gpus, product=product, memory_mib=memory_mib, mig_capable=mig_capable, labels=labels
        )
        with self.lock:
            return deepcopy(self.store.insert("Node", node))

    def add_gpu_nodes(self, prefix: str, count: int, **kwargs: Any) -> list[str]:
        """Bulk load under one lock acquisition: names are `<prefix>000`, `<prefix>001`, ... ."""
        width = len(str(max(count - 1, 0)))
        names = [f"{prefix}{index:0{width}d}" for index in range(count)]
        with self.lock:
            for name in names:
                self.store.insert("Node", build.gpu_node(name, **kwargs))
        return names

    def add_node(self, name: str, *, labels: dict[str, str] | None = None) -> dict:
        with self.lock:
            return deepcopy(self.store.insert("Node", build.plain_node(name, labels=labels)))

    def add_namespace(self, name: str, *, labels: dict[str, str] | None = None) -> dict:
        """A namespace that exists before the portal comes, made by whoever runs the cluster."""
        with self.lock:
            return deepcopy(self.store.insert("Namespace", build.namespace(name, labels)))

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str,
        resources: dict[str, int],
        phase: str = "Running",
        labels: dict[str, str] | None = None,
        resource_claims: list[dict] | None = None,
        claims: list[str] | None = None,
    ) -> dict:
        """A scheduled pod; its namespace is created when missing, to keep test setup short.

        `resource_claims` is its `spec.resourceClaims` (`{"name": ..., "resourceClaimName": ...}`), `claims`
        the names of those its container uses (`resources.claims`). Nothing here is validated or admitted:
        create the pod over HTTP for that."""
        pod = build.pod(
            namespace,
            name,
            node_name=node,
            resources=resources,
            phase=phase,
            labels=labels,
            resource_claims=resource_claims,
            claims=claims,
        )
        with self.lock:
            if not self.store.has_namespace(namespace):
                self.store.insert("Namespace", build.namespace(namespace))
            stored = self.store.insert("Pod", pod)
            self.store.refresh_quotas(namespace)
            return deepcopy(stored)

    def set_mig_outcome(self, node: str, outcome: str, *, applies: int | None = 1) -> None:
        """Force what the next `applies` MIG applies on `node` do (None: until set back to `success`)."""
        with self.lock:
            self._mig.set_outcome(node, outcome, applies)

    def set_device_plugin_outcome(self, node: str, outcome: str, *, applies: int | None = 1) -> None:
        """Force what the next `applies` device-plugin applies on `node` do (None: until set back to
        `success`): `failed` as a config it cannot read, `stall` as a plugin that never applies."""
        with self.lock:
            self._device_plugin.set_outcome(node, outcome, applies)

    def add_gpu_device_classes(self) -> list[dict]:
        """DeviceClasses `gpu.nvidia.com` and `mig.nvidia.com`, as NVIDIA's DRA driver chart installs them."""
        with self.lock:
            return [
                deepcopy(self.store.insert("DeviceClass", device_class)) for device_class in device_classes()
            ]

    def publish_gpu_slices(self, node: str, *, driver: str = DRIVER) -> dict:
        """Start NVIDIA's DRA driver on `node`: its ResourceSlice now, again after each MIG change there."""
        with self.lock:
            return deepcopy(self._dra_driver.publish(node, driver))

    def remove_gpu_slices(self, node: str) -> None:
        """Stop the DRA driver on `node`: its ResourceSlice goes (allocated claims keep their allocation)."""
        with self.lock:
            self._dra_driver.remove(node)

    def set_claim_outcome(self, namespace: str, name: str, outcome: str) -> None:
        """`pending` keeps the claim `namespace/name` unallocated (it need not exist yet); `allocate` lets the
        scheduler have it again."""
        with self.lock:
            self._claims.set_outcome(namespace, name, outcome)

    def claim_problem(self, namespace: str, name: str) -> str | None:
        """Why the claim is still unallocated, as the scheduler would tell on the pods waiting for it."""
        with self.lock:
            return self._claims.problem(namespace, name)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict | None:
        with self.lock:
            return deepcopy(self.store.get(kind, name, namespace))

    def objects(self, kind: str) -> list[dict]:
        kind = resource_for(kind).kind
        with self.lock:
            stored = self.store.by_key(kind)
            return [deepcopy(stored[key]) for key in self.store.keys(kind)]

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token of the service account `namespace/name`, authorized by the stored RBAC objects.

        The account itself need not exist yet (manifests may create it later), but a request made while it
        does not exist is refused with 401, as a real server refuses a deleted account's token."""
        token = f"sa.{namespace}.{name}.{secrets.token_urlsafe(16)}"
        with self.lock:
            self._service_account_tokens[token] = ServiceAccountUser(namespace, name)
        return token

    @property
    def grants(self) -> list[Grant]:
        """Every service-account request allowed so far, with the binding, role and rule that allowed it."""
        with self.lock:
            return list(self._authorizer.grants)

    @property
    def denials(self) -> list[tuple[str, RequestInfo]]:
        """Every service-account request refused so far: (user name, request info)."""
        with self.lock:
            return list(self._authorizer.denials)

    @property
    def admission_audits(self) -> list[AuditRecord]:
        """Every decision of a binding with the Audit action so far, as a real server would log it."""
        with self.lock:
            return list(self._admission.audits)

    def fail_requests(self, status: int, count: int = 1) -> None:
        with self.lock:
            self._failures.extend([status] * count)

    def compact(self, kind: str | None = None) -> None:
        """Forget the history of changes of one kind (`Node`, `pods`, ...) or of all, as etcd's compaction
        does: a watch from an older version, or a list continued with an older token, is answered 410."""
        with self.lock:
            self.store.compact(resource_for(kind).kind if kind else None)

    def drop_watches(self) -> int:
        """Cut every open watch stream, as a broken connection or a restarted server would; returns how many
        there were, once they are closed."""
        return self.watches.drop_all()

    @property
    def open_watches(self) -> int:
        return self.watches.count

    # --- HTTP ----------------------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: Any, body: bytes) -> Reply:
        """Answer one request: (code, JSON body, extra headers). Never raises."""
        self.requests.append((method, raw_path))
        review: Review | None = None
        try:
            with self.lock:
                failure = self._failures.pop(0) if self._failures else None
            if failure is not None:
                raise ApiError(failure, f"injected failure ({failure})")
            user = self._authenticate(headers.get("Authorization") or "")
            url = urlsplit(raw_path)
            query = dict(parse_qsl(url.query, keep_blank_values=True))
            info = request_info(method, url.path, query)
            if isinstance(user, ServiceAccountUser):  # the admin token is not subject to RBAC
                self._authorizer.authorize(user, info)
            review = self._admission.review(user)
            code, payload, extra = self._rest.route(
                info, query, headers.get("Content-Type") or "", body, review
            )
            return code, payload, [*extra, *review.warning_headers()]
        except ApiError as error:
            extra = [("Retry-After", "1")] if error.code == 429 else []
            # A real server sends the warnings of a refused request too.
            return error.code, error.status(), [*extra, *(review.warning_headers() if review else [])]
        except Exception:
            self.errors.append(traceback.format_exc())
            return 500, status_body(code=500, message=traceback.format_exc(), reason="InternalError"), []

    def _authenticate(self, authorization: str) -> User:
        """The admin, or the account of a service-account token; 401 for anything else."""
        scheme, _, token = authorization.partition(" ")
        if scheme == "Bearer" and token == self.token:
            return AdminUser()
        with self.lock:
            user = self._service_account_tokens.get(token) if scheme == "Bearer" else None
            if user is None or self.store.get("ServiceAccount", user.name, user.namespace) is None:
                raise ApiError(401, "Unauthorized")
        return user

    def _node_written(self, current: dict, node: dict) -> None:
        labels = node["metadata"].get("labels") or {}
        if labels.get(GPU_PRESENT_LABEL) != "true":
            return
        if labels.get(CONFIG_LABEL) != (current["metadata"].get("labels") or {}).get(CONFIG_LABEL):
            self._mig.config_changed(node)
        if device_plugin_config(node) != device_plugin_config(current):
            self._device_plugin.config_changed(node)


class _Handler(BaseHTTPRequestHandler):
    """Thin HTTP layer: read the body, let the server answer, write JSON with a Content-Length so that
    the client's pooled keep-alive connections stay usable."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; without this, Nagle plus delayed ACKs adds ~40 ms.
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        api: KubeApiServer = self.server.api  # type: ignore[attr-defined]
        code, payload, extra_headers = api.handle(self.command, self.path, self.headers, body)
        if isinstance(payload, Watch):
            self._stream(api, payload, extra_headers)
            return
        data = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for header, value in extra_headers:
            self.send_header(header, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, api: KubeApiServer, watch: Watch, extra_headers: list[tuple[str, str]]) -> None:
        """A watch's events as HTTP chunks, one line each, as a real server streams them."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        for header, value in extra_headers:
            self.send_header(header, value)
        self.end_headers()
        try:
            for line in watch.lines(self._client_gone):
                self.wfile.write(b"%X\r\n%s\r\n" % (len(line), line))
            api.watches.close(watch)  # closed before its client reads the end of it
            self.wfile.write(b"0\r\n\r\n")
        except Dropped:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:  # the client went away
            self.close_connection = True
        except Exception:
            api.errors.append(traceback.format_exc())
            self.close_connection = True
        finally:
            api.watches.close(watch)

    def _client_gone(self) -> bool:
        """Whether the client closed its end of a watch's connection."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests and benchmarks make thousands of requests."""
