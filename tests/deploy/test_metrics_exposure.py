"""No path of the shipped Ingress reaches the portal's figures.

Each Ingress path is followed to the Service it names, that Service's port to the container port of every pod
the Service selects, and the port must serve no figures: not a metrics port (CELERY_METRICS_PORT,
METRICS_PORT), and, where the path matches /metrics (`/` with pathType Prefix matches everything), a web
that serves /metrics on another port only. The web's side of that is proved here too, with the web's own
settings from the manifests: by the Django test client, and by gunicorn with deploy/gunicorn.conf.py."""

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from copy import deepcopy

import pytest
import requests

from tests.conftest import ROOT, database_address
from tests.deploy.manifests import manifests, of_kind, the
from tests.kube.semantics import label_matcher
from tests.monitoring.dcgm_exporter import free_port

METRICS = "/metrics"
METRICS_PORT_SETTINGS = ("METRICS_PORT", "CELERY_METRICS_PORT")


def env_of(container: dict) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container.get("env", [])}


def matches_metrics(path: dict) -> bool:
    """Whether an Ingress path takes /metrics, by Kubernetes' rules: Exact is the whole path, Prefix goes
    by path elements (`/` takes everything); ImplementationSpecific is taken as the widest, a prefix."""
    value = path.get("path") or "/"
    if path["pathType"] == "Exact":
        return value == METRICS
    if path["pathType"] == "Prefix":
        elements = [element for element in value.split("/") if element]
        return METRICS.strip("/").split("/")[: len(elements)] == elements
    return METRICS.startswith(value)


def backends(ingress: dict) -> Iterator[tuple[dict, dict]]:
    """(path, backend) of every path of every rule, and the default backend as the path `/`."""
    spec = ingress["spec"]
    if "defaultBackend" in spec:
        yield {"path": "/", "pathType": "Prefix"}, spec["defaultBackend"]
    for rule in spec.get("rules", []):
        for path in rule.get("http", {}).get("paths", []):
            yield path, path["backend"]


def pod_templates(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]


def reached_ports(backend: dict, namespace: str, objects: list[dict]) -> Iterator[tuple[str, dict, dict]]:
    """(workload, container, container port) of every container port the backend's traffic lands on."""
    assert set(backend) == {"service"}, f"a backend that is not a Service: {backend}"
    wanted = backend["service"]
    (service,) = [
        obj
        for obj in objects
        if obj["kind"] == "Service"
        and obj["metadata"]["name"] == wanted["name"]
        and obj["metadata"].get("namespace") == namespace
    ]
    if "name" in wanted["port"]:
        (port,) = [p for p in service["spec"]["ports"] if p.get("name") == wanted["port"]["name"]]
    else:
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == wanted["port"]["number"]]
    target = port.get("targetPort", port["port"])
    selector = ",".join(f"{key}={value}" for key, value in service["spec"]["selector"].items())
    for workload, template in pod_templates(objects):
        if not label_matcher(selector)(template["metadata"]["labels"]):
            continue
        for container in template["spec"]["containers"]:
            for container_port in container.get("ports", []):
                if target in (container_port.get("name"), container_port["containerPort"]):
                    yield workload, container, container_port


def metrics_reached(objects: list[dict]) -> list[str]:
    """Every way an Ingress of `objects` leads to the portal's figures, in words; empty when none does."""
    found = []
    for ingress in (obj for obj in objects if obj["kind"] == "Ingress"):
        namespace = ingress["metadata"].get("namespace")
        for path, backend in backends(ingress):
            where = f"Ingress {ingress['metadata']['name']} path {path.get('path')} ({path['pathType']})"
            for workload, container, port in reached_ports(backend, namespace, objects):
                env = env_of(container)
                served_on = {env[name] for name in METRICS_PORT_SETTINGS if env.get(name, "0") != "0"}
                number = str(port["containerPort"])
                if port.get("name") == "metrics" or number in served_on:
                    found.append(f"{where} reaches the metrics port {number} of {workload}")
                elif matches_metrics(path) and env.get("METRICS_PORT", "0") in ("", "0"):
                    found.append(
                        f"{where} reaches {workload} on {number}, which serves {METRICS} beside pages"
                    )
    return found


# --- the shipped manifests -------------------------------------------------------------------------------


def test_no_ingress_path_reaches_metrics():
    objects = [manifest.obj for manifest in manifests()]

    assert of_kind("Ingress")
    assert metrics_reached(objects) == []


def test_the_metrics_services_are_named_by_no_ingress_and_lead_to_metrics_ports_only():
    named = {backend["service"]["name"] for ingress in of_kind("Ingress") for _, backend in backends(ingress)}
    metrics_services = {"gpu-portal-web-metrics", "gpu-portal-worker-metrics"}

    assert not named & metrics_services
    for name in metrics_services:
        service = the("Service", name)["spec"]
        assert service["clusterIP"] == "None"  # one endpoint per pod: each is scraped
        assert service["ports"] == [{"name": "metrics", "port": 9540, "targetPort": "metrics"}]


def test_the_web_serves_metrics_on_its_own_port_and_the_token_is_required():
    (web,) = the("Deployment", "gpu-portal-web")["spec"]["template"]["spec"]["containers"]
    config = the("ConfigMap", "gpu-portal-config")["data"]
    ports = {port["name"]: port["containerPort"] for port in web["ports"]}

    assert env_of(web)["METRICS_PORT"] == str(ports["metrics"]) != str(ports["http"])
    assert int(config["TRUSTED_PROXY_COUNT"]) > 0  # so the token alone opens /metrics ...
    assert "METRICS_ALLOWED_NETWORKS" not in config  # ... and no network is offered as if it did
    assert "METRICS_TOKEN" in the("Secret", "gpu-portal-secrets")["stringData"]


# --- the check sees what it must -------------------------------------------------------------------------


def shipped() -> list[dict]:
    return deepcopy([manifest.obj for manifest in manifests()])


def web_container(objects: list[dict]) -> dict:
    (deployment,) = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpu-portal-web"
    ]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def ingress_paths(objects: list[dict]) -> list[dict]:
    (ingress,) = [o for o in objects if o["kind"] == "Ingress"]
    return ingress["spec"]["rules"][0]["http"]["paths"]


def test_the_check_sees_a_web_serving_metrics_beside_its_pages():
    """As shipped before: `/` to the web Service, and /metrics served on the web's http port."""
    objects = shipped()
    web = web_container(objects)
    web["env"] = [item for item in web["env"] if item["name"] != "METRICS_PORT"]

    (found,) = metrics_reached(objects)
    assert "path / (Prefix) reaches Deployment/gpu-portal-web on 8000" in found


def test_the_check_sees_an_ingress_naming_a_metrics_service():
    objects = shipped()
    ingress_paths(objects).append(
        {
            "path": "/figures",
            "pathType": "Prefix",
            "backend": {"service": {"name": "gpu-portal-worker-metrics", "port": {"number": 9540}}},
        }
    )

    found = metrics_reached(objects)
    assert found and all("/figures (Prefix) reaches the metrics port 9540 of" in line for line in found)
    assert any(line.endswith("Deployment/gpu-portal-worker") for line in found)


def test_the_check_sees_a_default_backend_on_the_web_metrics_service():
    objects = shipped()
    (ingress,) = [o for o in objects if o["kind"] == "Ingress"]
    ingress["spec"]["defaultBackend"] = {
        "service": {"name": "gpu-portal-web-metrics", "port": {"name": "metrics"}}
    }

    assert metrics_reached(objects) == [
        "Ingress gpu-portal path / (Prefix) reaches the metrics port 9540 of Deployment/gpu-portal-web"
    ]


@pytest.mark.parametrize(
    ("path", "path_type", "takes"),
    [
        ("/", "Prefix", True),
        ("/metrics", "Prefix", True),
        ("/metrics", "Exact", True),
        ("/metrics/", "Prefix", True),
        ("/met", "Prefix", False),
        ("/met", "ImplementationSpecific", True),
        ("/api", "Prefix", False),
        ("/", "Exact", False),
    ],
)
def test_which_paths_take_metrics(path, path_type, takes):
    assert matches_metrics({"path": path, "pathType": path_type}) is takes


# --- the web's side, with its own settings ---------------------------------------------------------------


def web_settings() -> tuple[int, int, int]:
    """(http port, metrics port, trusted proxies) as the manifests give them to the web."""
    (web,) = the("Deployment", "gpu-portal-web")["spec"]["template"]["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in web["ports"]}
    proxies = int(the("ConfigMap", "gpu-portal-config")["data"]["TRUSTED_PROXY_COUNT"])
    return ports["http"], int(env_of(web)["METRICS_PORT"]), proxies


@pytest.mark.django_db
def test_as_deployed_the_http_port_never_answers_metrics_and_the_metrics_port_wants_the_token(
    settings, client
):
    http, metrics_port, proxies = web_settings()
    settings.METRICS_PORT, settings.TRUSTED_PROXY_COUNT = metrics_port, proxies
    settings.METRICS_TOKEN = token = secrets.token_urlsafe(16)
    settings.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]  # what the ConfigMap offered before
    bearer = {"HTTP_AUTHORIZATION": f"Bearer {token}"}

    assert client.get(METRICS, SERVER_PORT=str(http), **bearer).status_code == 404
    on_port = {"SERVER_PORT": str(metrics_port), "REMOTE_ADDR": "10.1.2.3"}
    assert client.get(METRICS, **on_port).status_code == 403
    assert client.get(METRICS, **on_port, **bearer).status_code == 200


@pytest.mark.django_db
def test_gunicorn_serves_metrics_on_the_metrics_port_only(tmp_path, settings):
    """The web as the pod runs it: gunicorn with deploy/gunicorn.conf.py, production's HTTPS redirect and
    host check, a trusted proxy; the public port is asked as the ingress would forward a client."""
    http, metrics = free_port(), free_port()
    token = secrets.token_urlsafe(16)
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SECURE_", "SESSION_COOKIE_", "CSRF_COOKIE_"))
    }
    env = {
        **base,
        "PORT": str(http),
        "METRICS_PORT": str(metrics),
        "WEB_CONCURRENCY": "1",
        "DATABASE_URL": database_address(),
        "STATIC_ROOT": str(settings.STATIC_ROOT),  # collected once for the session (tests/conftest.py)
        "DEBUG": "false",
        "ALLOWED_HOSTS": "portal.example.com",
        "BEHIND_TLS_PROXY": "true",
        "TRUSTED_PROXY_COUNT": "1",
        "METRICS_TOKEN": token,
        "METRICS_ALLOWED_NETWORKS": "127.0.0.0/8",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = tmp_path / "gunicorn.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py", "portal.wsgi"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log_path.read_text()
            try:
                if requests.get(f"http://127.0.0.1:{http}/healthz", timeout=5).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # still starting
                pass
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        bearer = {"Authorization": f"Bearer {token}"}
        scraped = requests.get(f"http://127.0.0.1:{metrics}{METRICS}", headers=bearer, timeout=30)
        refused = requests.get(f"http://127.0.0.1:{metrics}{METRICS}", timeout=30)
        elsewhere = requests.get(f"http://127.0.0.1:{metrics}/accounts/login/", headers=bearer, timeout=30)
        public = requests.get(
            f"http://127.0.0.1:{http}{METRICS}",
            headers={**bearer, "Host": "portal.example.com", "X-Forwarded-Proto": "https",
                     "X-Forwarded-For": "203.0.113.9"},
            timeout=30, allow_redirects=False,
        )  # fmt: skip
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    output = log_path.read_text()
    assert scraped.status_code == 200, output
    assert "gpu_portal_pools" in scraped.text
    assert refused.status_code == 403  # 127.0.0.1 is in the networks, but a proxy is trusted
    assert elsewhere.status_code == 404
    assert public.status_code == 404, output
    assert "gpu_portal" not in public.text
