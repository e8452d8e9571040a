"""The fleet's figures on /metrics: what they say (parsed by the Prometheus client's own parser, checked by
promtool), what a scrape costs, and the Grafana dashboard that draws every app's figures. Who may read
/metrics: tests/portal/test_metrics.py."""

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

from monitoring.ingest.readings import ingest
from monitoring.models import GpuEvent
from pools.models import RequestState
from tests.factories import (
    AllocationFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    PoolFactory,
    PoolRequestFactory,
)
from tests.monitoring import test_fleet_pages as pages
from tests.portal import test_metrics as served

NOW, reading = pages.NOW, pages.reading
fleet, reported = pages.fleet, pages.reported  # the same hand-made fleet as the pages' tests
locked, scrape, families = served.locked, served.scrape, served.families

pytestmark = pytest.mark.django_db

PROMTOOL = "/usr/bin/promtool"
DASHBOARD = Path(django_settings.BASE_DIR) / "monitoring" / "grafana" / "gpu-portal.json"


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


def test_gpu_events_and_cluster_figures(reported, locked, client):
    now = timezone.now()
    GpuEvent.objects.create(gpu=reported.cut, at=now, kind=GpuEvent.Kind.XID, code=79)
    GpuEvent.objects.create(gpu=reported.cut, at=now, kind=GpuEvent.Kind.XID, code=48)
    GpuEvent.objects.create(gpu=reported.cut, at=now - timedelta(days=2), kind=GpuEvent.Kind.ECC, code=1)

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
