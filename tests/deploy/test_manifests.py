"""The portal's Kubernetes manifests (deploy/kubernetes), read as data: complete, listed by the
kustomization, and holding the invariants a safe rollout of web, workers, beat and migrations needs."""

import importlib.util
import re
from urllib.parse import urlsplit

import pytest
import yaml
from django.conf import settings

from billing.conf import settings as billing_settings
from monitoring.conf import settings as monitoring_settings
from pools import task_names
from pools.conf import settings as pools_settings
from pools.models import Cluster
from pools.tasks import execute_whatif_run
from portal import shell
from tests.deploy.manifests import (
    DEPLOY,
    KUBERNETES,
    ROOT,
    containers,
    kustomization,
    manifests,
    of_kind,
    the,
)
from tests.kube.semantics import label_matcher

NAMESPACE = "gpu-portal"
CLUSTER_KINDS = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
WORKLOADS = {
    "web": "gpu-portal-web",
    "worker": "gpu-portal-worker",
    "provisioning-worker": "gpu-portal-provisioning-worker",
    "sync-worker": "gpu-portal-sync-worker",
    "monitoring-worker": "gpu-portal-monitoring-worker",
    "metering-worker": "gpu-portal-metering-worker",
    "whatif-worker": "gpu-portal-whatif-worker",
    "beat": "gpu-portal-beat",
}
WORKERS = (
    "worker",
    "provisioning-worker",
    "sync-worker",
    "monitoring-worker",
    "metering-worker",
    "whatif-worker",
)
# The processes whose work reaches clusters, through the service account's token where the cluster is the one
# the portal runs in: the web, provisioning's and syncs' workers, and the default queue's for what was queued
# there before (its header).
TALK_TO_CLUSTERS = ("web", "worker", "provisioning-worker", "sync-worker")
SECRET_KEYS = {"SECRET_KEY", "CLUSTER_SECRETS_KEY", "DATABASE_URL", "REDIS_URL", "EMAIL_URL", "METRICS_TOKEN"}
CONFIG_KEYS = {
    "DEBUG",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "PORTAL_BASE_URL",
    "BEHIND_TLS_PROXY",
    "TRUSTED_PROXY_COUNT",
    "LOG_FORMAT",
    "PORTAL_NAMESPACE",
    "PROMETHEUS_MULTIPROC_DIR",
}


def deployment(component: str) -> dict:
    return the("Deployment", WORKLOADS[component])


def container_of(component: str) -> dict:
    (container,) = deployment(component)["spec"]["template"]["spec"]["containers"]
    return container


def pod_labels(component: str) -> dict:
    return deployment(component)["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    terms = ",".join(f"{key}={value}" for key, value in selector.items())
    return label_matcher(terms)(labels)


# --- files and the kustomization -------------------------------------------------------------------------


def test_every_document_is_an_object_with_kind_and_name():
    files = sorted(set(KUBERNETES.glob("*.yaml")) - {KUBERNETES / "kustomization.yaml"})

    assert files
    for path in files:
        documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert documents, f"{path.name} is empty"
        for document in documents:
            assert document.get("apiVersion") and document.get("kind"), path.name
            assert document.get("metadata", {}).get("name"), (
                f"{path.name}: a {document['kind']} without a name"
            )


def test_the_kustomization_lists_every_file_once_and_nothing_else():
    listed = kustomization()["resources"]
    present = {path.name for path in KUBERNETES.glob("*.y*ml")} - {"kustomization.yaml"}

    assert len(listed) == len(set(listed))
    assert set(listed) == present


def test_objects_are_unique():
    keys = [(m.kind, m.namespace, m.name) for m in manifests()]

    assert len(keys) == len(set(keys))


def test_each_object_names_its_namespace_since_the_kustomization_sets_none():
    """A top-level `namespace:` would move the gpu-operator Role into gpu-portal (kustomize overwrites)."""
    assert "namespace" not in kustomization()
    mig_namespace, _, _ = Cluster._meta.get_field("mig_config_map").default.partition("/")
    for manifest in manifests():
        if manifest.kind in CLUSTER_KINDS:
            assert not manifest.namespace, f"{manifest.kind} {manifest.name} is cluster-wide"
        elif manifest.kind in ("Role", "RoleBinding"):
            assert manifest.namespace == mig_namespace
        else:
            assert manifest.namespace == NAMESPACE, f"{manifest.kind} {manifest.name}"


def test_the_namespace_is_the_one_the_portal_keeps_for_itself():
    (namespace,) = of_kind("Namespace")

    assert namespace["metadata"]["name"] == NAMESPACE == settings.PORTAL_NAMESPACE
    assert the("ConfigMap", "gpu-portal-config")["data"]["PORTAL_NAMESPACE"] == NAMESPACE
    assert kustomization()["resources"][0] == "namespace.yaml"  # before anything that lives in it


def test_every_image_is_the_pinned_portal_image():
    (image,) = kustomization()["images"]
    expected = f"{image['name']}:{image['newTag']}"

    assert image["newTag"] not in ("", "latest")
    found = list(containers())
    assert len(found) == 9  # web, six workers, beat, migrate
    for owner, _, container in found:
        assert container["image"] == expected, owner
        assert container["imagePullPolicy"] == "IfNotPresent", owner


@pytest.mark.parametrize(
    ("image", "pinned"),
    [
        ("registry.example.com/gpu-portal:0.1.0", True),
        ("registry.example.com:5000/gpu-portal", False),
        ("registry.example.com/gpu-portal:latest", False),
        ("gpu-portal", False),
    ],
)
def test_a_pinned_image_has_a_tag_that_is_not_latest(image, pinned):
    assert is_pinned(image) is pinned


def is_pinned(image: str) -> bool:
    last = image.rpartition("/")[2]
    return ":" in last and last.rpartition(":")[2] != "latest"


# --- workloads -------------------------------------------------------------------------------------------


def test_replicas_web_two_workers_two_beat_exactly_one_and_never_two_during_a_rollout():
    assert deployment("web")["spec"]["replicas"] == 2
    for component in ("worker", "provisioning-worker", "sync-worker", "monitoring-worker"):
        assert deployment(component)["spec"]["replicas"] == 2, component
    assert deployment("metering-worker")["spec"]["replicas"] == 1  # its runs go one at a time anyway
    beat = deployment("beat")["spec"]
    assert beat["replicas"] == 1
    assert beat["strategy"] == {"type": "Recreate"}


def test_every_container_has_probes_and_bounded_resources():
    for component in WORKLOADS:
        container = container_of(component)
        assert container.get("livenessProbe"), component
        if component == "web":
            assert container.get("readinessProbe")
        resources = container["resources"]
        for bound in ("requests", "limits"):
            assert set(resources[bound]) == {"cpu", "memory"}, (component, bound)
            assert all(isinstance(value, str) for value in resources[bound].values())
    for owner, _, container in containers():
        assert set(container["resources"]["limits"]) == {"cpu", "memory"}, owner


def test_the_web_probes_ask_healthz_and_readyz_on_its_named_port():
    web = container_of("web")

    assert web["ports"] == [
        {"name": "http", "containerPort": 8000},
        {"name": "metrics", "containerPort": 9540},
    ]
    probes = {probe: web[probe]["httpGet"] for probe in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert probes == {
        "livenessProbe": {"path": "/healthz", "port": "http"},
        "readinessProbe": {"path": "/readyz", "port": "http"},
        "startupProbe": {"path": "/healthz", "port": "http"},
    }


@pytest.mark.parametrize("component", [*WORKERS, "beat"])
def test_celery_processes_serve_their_figures_where_the_liveness_probe_asks(component):
    container = container_of(component)
    env = {item["name"]: item["value"] for item in container.get("env", [])}

    assert container["ports"] == [{"name": "metrics", "containerPort": 9540}]
    assert env["CELERY_METRICS_PORT"] == "9540"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_worker_and_beat_commands():
    beat = container_of("beat")["command"]

    for component in WORKERS:
        worker = container_of(component)["command"]
        assert worker[:3] == ["celery", "--app=portal", "worker"], component
        assert {"--without-mingle", "--without-gossip"} <= set(worker), component
        # Each names the one queue it takes: none takes whatever it was not told to exclude.
        assert [word for word in worker if word.startswith("--queues=")], component
        assert not [word for word in worker if word.startswith("--exclude-queues")], component
    assert beat[:3] == ["celery", "--app=portal", "beat"]
    written = [word.partition("=")[2] for word in beat if word.startswith(("--schedule=", "--pidfile="))]
    assert written[0] == "/tmp/celerybeat-schedule"
    assert all(path == "" or path.startswith("/tmp/") for path in written)  # the only writable place
    assert "command" not in container_of("web")  # the image's default: gunicorn


def consumed_queues(command: list[str]) -> set[str]:
    """The queues a `celery worker` command consumes: those of --queues, else the default queue, less
    those of --exclude-queues."""
    given = {word.partition("=")[0]: word.partition("=")[2] for word in command if word.startswith("--")}
    default = settings.CELERY_TASK_DEFAULT_QUEUE
    queues = set(given["--queues"].split(",")) if "--queues" in given else {default}
    return queues - set(given.get("--exclude-queues", "").split(","))


def test_each_queue_the_portal_sends_to_has_workers_of_its_own():
    consumed = {component: consumed_queues(container_of(component)["command"]) for component in WORKERS}
    routes = shell.task_routes()
    routed = {route["queue"] for route in routes.values()}
    default = settings.CELERY_TASK_DEFAULT_QUEUE

    assert set().union(*consumed.values()) == {default, *routed}
    assert consumed == {
        "worker": {default},
        "provisioning-worker": {pools_settings.PROVISIONING_QUEUE},
        "sync-worker": {pools_settings.SYNC_QUEUE},
        "monitoring-worker": {monitoring_settings.MONITORING_QUEUE},
        "metering-worker": {billing_settings.METERING_QUEUE},
        "whatif-worker": {pools_settings.WHATIF_QUEUE},
    }
    assert routes[task_names.WHATIF_RUN] == {"queue": pools_settings.WHATIF_QUEUE}
    assert routes[task_names.PROVISION] == {"queue": pools_settings.PROVISIONING_QUEUE}
    assert routes[task_names.SYNC] == {"queue": pools_settings.SYNC_QUEUE}


def test_the_what_if_workers_run_as_many_runs_at_once_as_the_portal_lets_go():
    command = container_of("whatif-worker")["command"]
    (concurrency,) = [int(word.partition("=")[2]) for word in command if word.startswith("--concurrency=")]

    assert deployment("whatif-worker")["spec"]["replicas"] * concurrency >= pools_settings.WHATIF_MAX_RUNNING


def gunicorn_graceful_timeout() -> int:
    spec = importlib.util.spec_from_file_location("gunicorn_settings", DEPLOY / "gunicorn.conf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.graceful_timeout


def test_the_web_stops_routing_before_gunicorn_drains_and_drains_within_the_grace_period():
    pod = deployment("web")["spec"]["template"]["spec"]
    (command,) = [container_of("web")["lifecycle"]["preStop"]["exec"]["command"]]

    assert command[0] == "sleep"
    pause = int(command[1])
    assert pause >= 5
    assert pod["terminationGracePeriodSeconds"] == 45
    assert pod["terminationGracePeriodSeconds"] > pause + gunicorn_graceful_timeout()


def test_workers_have_time_to_finish_their_tasks():
    grace = {
        component: deployment(component)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for component in WORKERS
    }
    whatif_grace = grace.pop("whatif-worker")

    assert min(grace.values()) >= 120
    # A rollout lets a what-if run finish: the grace outlasts the task's hard time limit.
    assert whatif_grace > execute_whatif_run.time_limit > pools_settings.WHATIF_RUN_SECONDS
    assert (
        settings.CELERY_TASK_ACKS_LATE and settings.CELERY_TASK_REJECT_ON_WORKER_LOST
    )  # the rest comes back


def test_every_pod_runs_as_non_root_with_a_read_only_root_and_no_privileges():
    for owner, pod, container in containers():
        context = container["securityContext"]
        assert pod["securityContext"]["runAsNonRoot"] is True, owner
        assert context["runAsNonRoot"] is True, owner
        assert context["runAsUser"] == pod["securityContext"]["runAsUser"] == 10001, owner
        assert context["readOnlyRootFilesystem"] is True, owner
        assert context["allowPrivilegeEscalation"] is False, owner
        assert context["capabilities"] == {"drop": ["ALL"]}, owner
        mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        assert "emptyDir" in volumes[mounts["/tmp"]], owner
    multiproc = the("ConfigMap", "gpu-portal-config")["data"]["PROMETHEUS_MULTIPROC_DIR"]
    assert multiproc.startswith("/tmp/")


def test_only_the_processes_that_talk_to_clusters_carry_the_service_account_token():
    for owner, pod, _ in containers():
        assert pod["serviceAccountName"] == "gpu-portal", owner
        talks_to_clusters = owner in {f"Deployment/{WORKLOADS[component]}" for component in TALK_TO_CLUSTERS}
        assert pod.get("automountServiceAccountToken", True) is talks_to_clusters, owner


def test_pods_of_each_deployment_of_several_replicas_prefer_different_nodes():
    several = [component for component in WORKLOADS if deployment(component)["spec"]["replicas"] > 1]

    assert set(several) == {"web", "worker", "provisioning-worker", "sync-worker", "monitoring-worker"}
    for component in several:
        affinity = deployment(component)["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (preferred,) = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        term = preferred["podAffinityTerm"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert (
            term["labelSelector"]["matchLabels"] == deployment(component)["spec"]["selector"]["matchLabels"]
        )


def test_each_deployment_selects_its_own_pods_only():
    for component in WORKLOADS:
        selector = deployment(component)["spec"]["selector"]["matchLabels"]
        assert [other for other in WORKLOADS if selects(selector, pod_labels(other))] == [component]


def test_every_container_gets_the_settings_and_the_secrets():
    names = {("ConfigMap", m["metadata"]["name"]) for m in of_kind("ConfigMap")}
    names |= {("Secret", m["metadata"]["name"]) for m in of_kind("Secret")}
    for owner, _, container in containers():
        sources = [next(iter(source.items())) for source in container["envFrom"]]
        assert sources == [
            ("configMapRef", {"name": "gpu-portal-config"}),
            ("secretRef", {"name": "gpu-portal-secrets"}),
        ], owner
    assert names == {("ConfigMap", "gpu-portal-config"), ("Secret", "gpu-portal-secrets")}


def first_apply_selector() -> str:
    """The label selector of the first `kubectl apply` that migrate-job.yaml's header gives."""
    header = (KUBERNETES / "migrate-job.yaml").read_text().split("apiVersion:")[0]
    text = " ".join(line.lstrip("#").strip() for line in header.splitlines()).replace("\\ ", "")
    (selector,) = re.findall(r"kubectl apply -k deploy/kubernetes\s+-l '([^']+)'", text)
    return selector


def test_the_first_apply_of_an_upgrade_starts_the_migrations_and_no_process_of_the_new_code():
    """What the header's first apply selects: the Job and what it needs, and none of the Deployments, which
    must not meet the old schema (a new worker Deployment missing from the selector would)."""
    matches = label_matcher(first_apply_selector())
    applied = {(m.kind, m.name) for m in manifests() if matches(m.obj["metadata"].get("labels", {}))}

    assert not {(kind, name) for kind, name in applied if kind == "Deployment"}
    assert {
        ("Namespace", NAMESPACE),
        ("ServiceAccount", "gpu-portal"),
        ("ConfigMap", "gpu-portal-config"),
        ("Secret", "gpu-portal-secrets"),
        ("Job", "gpu-portal-migrate"),
    } <= applied


def test_the_migrate_job_runs_once_to_completion_before_the_deployments():
    job = the("Job", "gpu-portal-migrate")
    pod = job["spec"]["template"]["spec"]
    order = kustomization()["resources"]

    assert pod["containers"][0]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert pod["restartPolicy"] == "Never"
    assert 0 < job["spec"]["backoffLimit"] <= 6
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    first_deployment = min(order.index(f) for f in {m.file for m in manifests() if m.kind == "Deployment"})
    assert order.index("migrate-job.yaml") < first_deployment
    header = (KUBERNETES / "migrate-job.yaml").read_text().split("apiVersion:")[0]
    assert "BEFORE the Deployments" in header


# --- settings and secrets --------------------------------------------------------------------------------


def read_by_the_portal(key: str) -> bool:
    sources = [*ROOT.joinpath("portal").glob("*.py"), DEPLOY / "gunicorn.conf.py"]
    return any(f'"{key}"' in path.read_text() for path in sources)


def test_the_config_map_holds_the_production_settings():
    data = the("ConfigMap", "gpu-portal-config")["data"]

    assert set(data) == CONFIG_KEYS
    assert all(isinstance(value, str) for value in data.values())
    assert (data["DEBUG"], data["BEHIND_TLS_PROXY"], data["LOG_FORMAT"]) == ("false", "true", "json")
    assert data["TRUSTED_PROXY_COUNT"] == "1"  # the ingress controller
    assert all(read_by_the_portal(key) for key in data), [key for key in data if not read_by_the_portal(key)]


def test_the_public_host_is_the_same_everywhere():
    data = the("ConfigMap", "gpu-portal-config")["data"]
    ingress = the("Ingress", "gpu-portal")["spec"]
    (rule,) = ingress["rules"]
    (tls,) = ingress["tls"]

    host = rule["host"]
    assert tls == {"hosts": [host], "secretName": "gpu-portal-tls"}
    assert host in data["ALLOWED_HOSTS"].split(",")
    assert data["CSRF_TRUSTED_ORIGINS"] == f"https://{host}"
    assert urlsplit(data["PORTAL_BASE_URL"])[:2] == ("https", host)


def test_the_secret_holds_placeholders_for_every_secret_setting():
    secret = the("Secret", "gpu-portal-secrets")

    assert secret["type"] == "Opaque"
    assert "data" not in secret  # readable placeholders only
    assert set(secret["stringData"]) == SECRET_KEYS
    assert all("change-me" in value for value in secret["stringData"].values())  # nothing real committed
    assert all(read_by_the_portal(key) for key in SECRET_KEYS)
    assert not set(secret["stringData"]) & set(the("ConfigMap", "gpu-portal-config")["data"])


# --- traffic ---------------------------------------------------------------------------------------------


def test_the_service_and_ingress_lead_to_the_webs_named_port():
    service = the("Service", "gpu-portal-web")["spec"]
    ingress = the("Ingress", "gpu-portal")["spec"]
    (port,) = service["ports"]
    (path,) = ingress["rules"][0]["http"]["paths"]

    assert service["type"] == "ClusterIP"
    assert selects(service["selector"], pod_labels("web"))
    assert not selects(service["selector"], pod_labels("worker"))
    assert (port["name"], port["port"], port["targetPort"]) == ("http", 80, "http")
    assert port["targetPort"] in {p["name"] for p in container_of("web")["ports"]}
    assert ingress["ingressClassName"] == "nginx"
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    backend = path["backend"]["service"]
    assert backend["name"] == "gpu-portal-web"
    named = {p["name"]: p["port"] for p in service["ports"]}
    assert named.get(backend["port"].get("name")) == 80 or backend["port"].get("number") == 80


def test_the_worker_metrics_service_is_headless_on_the_metrics_port_of_every_worker():
    service = the("Service", "gpu-portal-worker-metrics")["spec"]

    assert service["clusterIP"] == "None"
    assert [
        component for component in WORKLOADS if selects(service["selector"], pod_labels(component))
    ] == list(WORKERS)
    assert service["ports"] == [{"name": "metrics", "port": 9540, "targetPort": "metrics"}]


def test_the_disruption_budget_keeps_a_web_pod():
    budget = the("PodDisruptionBudget", "gpu-portal-web")

    assert budget["apiVersion"] == "policy/v1"
    assert budget["spec"]["minAvailable"] == 1
    selector = budget["spec"]["selector"]["matchLabels"]
    assert selects(selector, pod_labels("web"))
    assert not selects(selector, pod_labels("worker")) and not selects(selector, pod_labels("beat"))
