"""/metrics: who may read it, what it says (parsed by the Prometheus client's own parser, checked by
promtool), what it costs, and the Grafana dashboard that draws it."""

import gzip
import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from billing.services import metering_lag
from monitoring.ingest import ingest
from monitoring.models import GpuEvent
from pools.models import PoolEvent, PoolState, RequestState
from tests.factories import (
    AllocationFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    PoolFactory,
    PoolRequestFactory,
)
from tests.monitoring import test_fleet_pages as pages

NOW, reading = pages.NOW, pages.reading
fleet, reported = pages.fleet, pages.reported  # the same hand-made fleet as the pages' tests

pytestmark = pytest.mark.django_db

PROMTOOL = "/usr/bin/promtool"
DASHBOARD = Path(django_settings.BASE_DIR) / "monitoring" / "grafana" / "gpu-portal.json"
TOKEN = "s3cret-metrics-token"


@pytest.fixture
def locked(settings):
    """A token is set and no network is allowed."""
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOWED_NETWORKS = []
    return settings


def scrape(client, **headers) -> str:
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **headers)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/plain")
    return answer.content.decode()


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


# --- who may read it ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, False),
        ({"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}, True),
        ({"HTTP_AUTHORIZATION": f"bearer {TOKEN}"}, True),
        ({"HTTP_AUTHORIZATION": "Bearer wrong"}, False),
        ({"HTTP_AUTHORIZATION": f"Bearer {TOKEN}x"}, False),
        ({"HTTP_AUTHORIZATION": f"Basic {TOKEN}"}, False),
        ({"HTTP_AUTHORIZATION": "Bearer ünïcode"}, False),
    ],
)
def test_a_token_opens_it(headers, allowed, locked, client):
    answer = client.get("/metrics", **headers)

    assert answer.status_code == (200 if allowed else 403)
    if not allowed:
        assert answer["Content-Type"].startswith("text/plain") and b"Forbidden" in answer.content
        assert b"gpu_portal" not in answer.content


def test_no_token_set_means_no_token_opens_it(locked, client):
    locked.METRICS_TOKEN = ""

    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer ").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer").status_code == 403


@pytest.mark.parametrize(
    ("networks", "address", "allowed"),
    [
        (["10.0.0.0/8"], "10.1.2.3", True),
        (["10.0.0.0/8"], "192.168.1.1", False),
        (["not-a-network", "192.168.1.0/24"], "192.168.1.9", True),
        (["192.168.1.7"], "192.168.1.7", True),
        (["127.0.0.1/32"], "::ffff:127.0.0.1", True),
        (["::1/128"], "::1", True),
        (["0.0.0.0/0"], "::1", False),
        (["10.0.0.0/8"], "garbage", False),
        ([], "127.0.0.1", False),
    ],
)
def test_an_allowed_network_opens_it(networks, address, allowed, locked, client):
    locked.METRICS_ALLOWED_NETWORKS = networks

    assert client.get("/metrics", REMOTE_ADDR=address).status_code == (200 if allowed else 403)


@pytest.mark.parametrize("address", ["10.1.2.3", "127.0.0.1", "::1"])
def test_behind_a_proxy_no_address_opens_it_only_the_token(address, locked, client):
    """Behind an ingress controller every client arrives from the cluster's network: the address says
    nothing of who is asking."""
    locked.METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "127.0.0.1/32", "::1/128"]
    locked.TRUSTED_PROXY_COUNT = 1

    refused = client.get("/metrics", REMOTE_ADDR=address)
    assert refused.status_code == 403
    assert b"gpu_portal" not in refused.content and b"network" not in refused.content
    opened = client.get("/metrics", REMOTE_ADDR=address, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert opened.status_code == 200


METRICS_PORT = 9540


def test_with_a_metrics_port_the_public_port_answers_404(locked, client):
    locked.METRICS_PORT = METRICS_PORT

    answer = client.get("/metrics", SERVER_PORT="8000", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert answer.status_code == 404
    assert b"gpu_portal" not in answer.content


def test_the_metrics_port_answers_a_pods_address_over_plain_http_and_nothing_but_metrics(locked, client):
    """Prometheus asks each pod by its address: no host check, no HTTPS redirect, as for the probes."""
    locked.METRICS_PORT = METRICS_PORT
    locked.ALLOWED_HOSTS = ["portal.example.com"]
    locked.SECURE_SSL_REDIRECT = True
    on_port = {"SERVER_PORT": str(METRICS_PORT), "HTTP_HOST": "10.2.3.4:9540"}
    token = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}

    assert "gpu_portal_pools" in scrape(client, **on_port)
    assert client.get("/metrics", **on_port).status_code == 403
    for path in ("/", "/metrics/", "/admin/", "/api/v1/", "/accounts/login/", "/static/nothing.css"):
        answer = client.get(path, **on_port, **token)
        assert answer.status_code == 404, path
        assert answer.content == b"Not found: this port serves /metrics only.\n"
    assert client.get("/healthz", **on_port).status_code == 200
    # The public port is where the pages are, with the host check and the redirect.
    assert client.get("/", HTTP_HOST="10.2.3.4:8000", SERVER_PORT="8000").status_code == 400


def test_only_reads_are_answered(locked, client):
    assert client.post("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 405


def test_a_scraper_that_takes_gzip_gets_it(reported, locked, client):
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", HTTP_ACCEPT_ENCODING="gzip")

    assert answer["Content-Encoding"] == "gzip"
    assert "gpu_portal_gpu_power_watts" in gzip.decompress(answer.content).decode()


# --- what it says ---------------------------------------------------------------------------------


def _labels(fleet, gpu, **changes):
    labels = {
        "cluster": "sim",
        "node": "gpu-node-1",
        "gpu": str(gpu.index),
        "uuid": gpu.uuid,
        "model": "H100-80GB",
        "profile": "full",
        "mig_start": "",
        "tenant": "",
        "project": "",
        "pool": "",
    }
    return {**labels, **changes}


def _samples(found, name):
    return {tuple(sorted(s.labels.items())): s.value for s in found[name].samples}


def test_gpu_figures_carry_where_they_are_and_who_holds_them(reported, locked, client):
    found = families(scrape(client))

    acme_gpu = _labels(
        reported, reported.full, tenant="acme", project="vision", pool=str(reported.acme_pool.pk)
    )
    cut_whole = _labels(reported, reported.cut)
    held = _labels(
        reported,
        reported.cut,
        profile="3g.40gb",
        mig_start="0",
        tenant="globex",
        project="recsys",
        pool=str(reported.globex_pool.pk),
    )
    free = _labels(reported, reported.cut, profile="3g.40gb", mig_start="4")
    key = lambda labels: tuple(sorted(labels.items()))  # noqa: E731

    assert _samples(found, "gpu_portal_gpu_power_watts") == {key(acme_gpu): 300.0, key(cut_whole): 200.0}
    assert _samples(found, "gpu_portal_gpu_temperature_celsius") == {
        key(acme_gpu): 70.0,
        key(cut_whole): 80.0,
    }
    assert _samples(found, "gpu_portal_gpu_utilisation_ratio") == {key(acme_gpu): 0.6}
    assert _samples(found, "gpu_portal_gpu_sm_active_ratio") == {
        key(acme_gpu): 0.5,
        key(held): pytest.approx(0.2),
        key(free): pytest.approx(0.9),
    }
    assert _samples(found, "gpu_portal_gpu_memory_used_bytes") == {
        key(acme_gpu): 10 * 2**30,
        key(held): 2**30,
        key(free): 2 * 2**30,
    }
    assert _samples(found, "gpu_portal_gpu_memory_total_bytes")[key(cut_whole)] == 80 * 2**30
    assert _samples(found, "gpu_portal_gpu_ecc_errors") == {
        key({**acme_gpu, "type": "corrected"}): 3.0,
        key({**acme_gpu, "type": "uncorrected"}): 0.0,
    }
    seen = _samples(found, "gpu_portal_gpu_last_seen_timestamp_seconds")
    assert set(seen) == {key(acme_gpu), key(cut_whole), key(held), key(free)}
    assert set(seen.values()) == {NOW.timestamp()}
    assert found["gpu_portal_gpu_power_watts"].type == "gauge"
    assert "spare" not in str(found)  # a GPU that never reported has no figures


def test_a_silent_gpu_keeps_only_when_it_was_last_seen(fleet, locked, client):
    ingest(cluster=fleet.cluster, readings=[reading(fleet, at=NOW - timedelta(minutes=30))], source="agent")

    found = families(scrape(client))

    assert not found["gpu_portal_gpu_power_watts"].samples
    assert len(found["gpu_portal_gpu_last_seen_timestamp_seconds"].samples) == 4


def test_cluster_events_and_portal_figures(reported, locked, client, tenancy, settings):
    now = timezone.now()
    GpuEvent.objects.create(gpu=reported.cut, at=now, kind=GpuEvent.Kind.XID, code=79)
    GpuEvent.objects.create(gpu=reported.cut, at=now, kind=GpuEvent.Kind.XID, code=48)
    GpuEvent.objects.create(gpu=reported.cut, at=now - timedelta(days=2), kind=GpuEvent.Kind.ECC, code=1)
    PoolRequestFactory(project=tenancy.vision, state=RequestState.QUEUED)
    PoolRequestFactory(project=tenancy.vision, state=RequestState.QUEUED)
    approved = PoolRequestFactory(project=tenancy.vision, state=RequestState.APPROVED)
    type(approved).objects.filter(pk=approved.pk).update(approved_at=now - timedelta(minutes=20))
    PoolRequestFactory(project=tenancy.vision, state=RequestState.SUBMITTED)
    # Provisioning that took 60 s and 120 s; one that failed after 600 s, two days ago.
    for seconds, outcome, ago in (
        (60, PoolState.ACTIVE, 0),
        (120, PoolState.ACTIVE, 0),
        (600, PoolState.FAILED, 2),
    ):
        pool = PoolFactory(project=tenancy.vision, cluster=reported.cluster, state=outcome)
        event = PoolEvent.objects.create(
            request=pool.request, pool=pool, from_state=PoolState.PROVISIONING, to_state=outcome
        )
        at = now - timedelta(days=ago)
        PoolEvent.objects.filter(pk=event.pk).update(at=at)
        type(pool).objects.filter(pk=pool.pk).update(reserved_at=at - timedelta(seconds=seconds))
    # One pool past the sweeper's re-drive deadline, one past the point where it should have failed it.
    PoolFactory(
        project=tenancy.vision,
        cluster=reported.cluster,
        state=PoolState.PROVISIONING,
        reserved_at=now - timedelta(seconds=settings.POOL_REDRIVE_SECONDS + 60),
    )
    PoolFactory(
        project=tenancy.vision,
        cluster=reported.cluster,
        state=PoolState.PROVISIONING,
        reserved_at=now - timedelta(seconds=settings.POOL_STUCK_SECONDS + 60),
    )

    found = families(scrape(client))

    events = _samples(found, "gpu_portal_gpu_events_24h")
    assert list(events.values()) == [2.0]
    assert dict(next(iter(events))) == {
        "cluster": "sim",
        "node": "gpu-node-1",
        "gpu": "1",
        "uuid": reported.cut.uuid,
        "model": "H100-80GB",
        "kind": "xid",
    }
    compute = {
        dict(k)["kind"]: v
        for k, v in _samples(found, "gpu_portal_cluster_compute_slices").items()
        if ("cluster", "sim") in k
    }
    assert compute == {"total": 14, "allocated": 10, "measured": 10, "used": pytest.approx(4.1)}
    assert _samples(found, "gpu_portal_cluster_gpus")[(("cluster", "other"), ("kind", "reporting"))] == 0
    assert _samples(found, "gpu_portal_requests_waiting") == {
        (("state", "approved"),): 1,
        (("state", "queued"),): 2,
    }
    assert found["gpu_portal_requests_waiting_oldest_seconds"].samples[0].value == pytest.approx(1200, abs=30)
    pools = {dict(k)["state"]: v for k, v in _samples(found, "gpu_portal_pools").items()}
    assert pools == {"provisioning": 2, "active": 4, "releasing": 0, "released": 0, "failed": 1}

    provisioning = found["gpu_portal_pool_provisioning_seconds"]
    assert provisioning.type == "summary"
    by = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in provisioning.samples}
    active, failed = (("outcome", "active"),), (("outcome", "failed"),)
    assert by[("gpu_portal_pool_provisioning_seconds_count", active)] == 2
    assert by[("gpu_portal_pool_provisioning_seconds_sum", active)] == pytest.approx(180)
    assert by[
        ("gpu_portal_pool_provisioning_seconds", (("outcome", "active"), ("quantile", "0.5")))
    ] == pytest.approx(90)
    assert by[("gpu_portal_pool_provisioning_seconds_count", failed)] == 1  # since ever
    assert by[("gpu_portal_pool_provisioning_seconds_sum", failed)] == pytest.approx(600)
    assert (
        by[("gpu_portal_pool_provisioning_seconds", (("outcome", "failed"), ("quantile", "0.9")))]
        != by[("gpu_portal_pool_provisioning_seconds", (("outcome", "failed"), ("quantile", "0.9")))]
    )  # NaN: none in the last 24 hours

    overdue = {
        (dict(k)["state"], dict(k)["deadline"]): v
        for k, v in _samples(found, "gpu_portal_pools_overdue").items()
    }
    assert overdue == {
        ("provisioning", "redrive"): 1,
        ("provisioning", "stuck"): 1,
        ("releasing", "redrive"): 0,
        ("releasing", "stuck"): 0,
    }
    oldest = found["gpu_portal_pools_overdue_oldest_seconds"].samples[0].value
    assert oldest == pytest.approx(settings.POOL_STUCK_SECONDS + 60, abs=30)
    lag = found["gpu_portal_metering_lag_seconds"].samples[0].value
    assert lag > 0 and lag == pytest.approx(metering_lag().total_seconds(), abs=30)


def test_promtool_finds_no_problem(reported, locked, client, tenancy):
    if not shutil.which(PROMTOOL):
        pytest.fail(f"{PROMTOOL} is missing: install the Debian package `prometheus` (CI installs it).")
    GpuEvent.objects.create(gpu=reported.cut, at=timezone.now(), kind=GpuEvent.Kind.LOST)
    PoolRequestFactory(project=tenancy.vision, state=RequestState.QUEUED)
    text = scrape(client)

    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""


def test_promtool_would_say_so(locked):
    """The check above can fail: promtool objects to a counter without its suffix."""
    if not shutil.which(PROMTOOL):
        pytest.fail(f"{PROMTOOL} is missing: install the Debian package `prometheus` (CI installs it).")
    bad = "# HELP requests Requests.\n# TYPE requests counter\nrequests 1\n"
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=bad, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode != 0 or (checked.stdout + checked.stderr).strip()


def test_a_scrape_costs_the_same_queries_for_a_few_gpus_or_many(reported, locked, client, tenancy):
    scrape(client)
    with CaptureQueriesContext(connection) as few:
        scrape(client)
    node = NodeCapacityFactory(cluster=reported.other, name="n3", gpu_model="H100-80GB")
    for index in range(6):
        gpu = GpuCapacityFactory(node=node, index=index)
        AllocationFactory(pool=PoolFactory(project=tenancy.vision, cluster=reported.other), gpu=gpu)
        GpuEvent.objects.create(gpu=gpu, at=timezone.now(), kind=GpuEvent.Kind.LOST)
    with CaptureQueriesContext(connection) as many:
        scrape(client)
    assert len(many) == len(few) <= 12


# --- the Grafana dashboard ------------------------------------------------------------------------

PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "topk", "bottomk", "rate", "irate", "increase", "time", "by",
    "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool",
    "label_values", "histogram_quantile", "clamp_min", "clamp_max", "abs", "vector", "scalar",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, strings, ranges and
    grouping clauses, that are not functions or keywords."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"label_values\((.*),\s*\w+\s*\)", r"(\1)", text)  # its last argument is a label
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text))
    return {name for name in names if name not in PROMQL_WORDS and not re.fullmatch(r"\d+[smhdwy]?", name)}


def test_metric_names_are_read_out_of_promql():
    assert metric_names('sum by (cluster) (a_b{x="y{z}"}) / ignoring(kind) rate(c_total[5m]) > 600') == {
        "a_b",
        "c_total",
    }
    assert metric_names('label_values(up{job=~"$job"}, instance)') == {"up"}


def test_the_dashboard_draws_only_what_metrics_exposes(reported, locked, client):
    dashboard = json.loads(DASHBOARD.read_text())
    client.get("/accounts/login/")  # a web answer timed, so that the request histogram has its samples
    exposed = set()
    for family in text_string_to_metric_families(scrape(client)):
        exposed |= {family.name} | {sample.name for sample in family.samples}
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]

    assert len(exprs) > 10
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert used and used - exposed == set()
    for wanted in (
        "gpu_portal_gpu_power_watts",
        "gpu_portal_metering_lag_seconds",
        "gpu_portal_pools_overdue",
        "gpu_portal_http_request_duration_seconds_bucket",
        "gpu_portal_task_queue_length",
    ):
        assert wanted in used
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert {"cluster", "node"} <= set(variables)
    assert all(
        panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        for panel in dashboard["panels"]
        if "datasource" in panel
    )
