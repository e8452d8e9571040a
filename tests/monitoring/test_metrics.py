"""The fleet's figures on /metrics: per cluster (the fleet page's own), per tenant and per pool, and GPUs one
by one only while in trouble (parsed by the Prometheus client's own parser, checked by promtool); what a
scrape costs, and the Grafana dashboard that draws every app's figures. Who may read /metrics:
tests/portal/test_metrics.py. A scrape's size and time at 100,000 GPUs: bench/metrics.py."""

import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import connection
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from monitoring import selectors
from monitoring.ingest.readings import ingest
from monitoring.models import Alert, GpuEvent, GpuFault, Latest
from pools.models import Allocation, Pool, PoolState, RequestState
from tests.factories import (
    AlertFactory,
    AlertRuleFactory,
    AllocationFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    PoolFactory,
    PoolRequestFactory,
    ProjectFactory,
    TenantFactory,
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

GIB = 2**30


def _labels(gpu, **changes):
    labels = {
        "cluster": "sim",
        "node": "gpu-node-1",
        "gpu": str(gpu.index),
        "uuid": gpu.uuid,
        "profile": "full",
        "mig_start": "",
        "pool": "",
    }
    return {**labels, **changes}


def key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def _samples(found, name):
    return {key(s.labels): s.value for s in found[name].samples}


def _by(found, name, label, **where):
    """A family's values by one label, of the samples whose other labels are `where`."""
    return {
        s.labels[label]: s.value
        for s in found[name].samples
        if all(s.labels.get(k) == v for k, v in where.items())
    }


def _open_fault(gpu, kind=GpuEvent.Kind.XID):
    return GpuFault.objects.create(gpu=gpu, kind=kind, code=79, at=timezone.now(), drained_by_portal=True)


def test_cluster_figures_are_the_fleet_pages(reported, locked, client):
    now = timezone.now()
    GpuEvent.objects.create(gpu=reported.cut, at=now, kind=GpuEvent.Kind.XID, code=79)
    GpuEvent.objects.create(gpu=reported.cut, at=now, kind=GpuEvent.Kind.XID, code=48)
    GpuEvent.objects.create(gpu=reported.cut, at=now - timedelta(days=2), kind=GpuEvent.Kind.ECC, code=1)
    _open_fault(reported.cut)

    found = families(scrape(client))

    assert _by(found, "gpu_portal_cluster_compute_slices", "kind", cluster="sim") == {
        "total": 14,
        "allocated": 10,
        "measured": 10,
        "used": pytest.approx(4.1),
    }
    assert _by(found, "gpu_portal_cluster_gpus", "kind", cluster="sim") == {"present": 2, "reporting": 2}
    assert _by(found, "gpu_portal_cluster_gpus", "kind", cluster="other") == {"present": 1, "reporting": 0}
    assert _by(found, "gpu_portal_cluster_power_watts", "cluster") == {"other": 0, "sim": 500}
    assert _by(found, "gpu_portal_cluster_memory_used_bytes", "cluster")["sim"] == 10 * GIB
    assert _by(found, "gpu_portal_cluster_memory_total_bytes", "cluster")["sim"] == 160 * GIB
    # The same code as the fleet page's: every figure its table shows.
    for usage in selectors.cluster_usage():
        compute = _by(found, "gpu_portal_cluster_compute_slices", "kind", cluster=usage.name)
        assert compute == {
            "total": usage.compute_total,
            "allocated": usage.allocated,
            "measured": usage.measured,
            "used": pytest.approx(usage.used),
        }
        assert _by(found, "gpu_portal_cluster_power_watts", "cluster")[usage.name] == usage.power_w
    # Averaged over the GPUs that give it: the cut GPU gives none.
    assert _by(found, "gpu_portal_cluster_utilisation_ratio", "cluster") == {"sim": pytest.approx(0.6)}
    assert _by(found, "gpu_portal_cluster_temperature_max_celsius", "cluster") == {"sim": 80}
    assert _by(found, "gpu_portal_cluster_gpu_faults_open", "cluster") == {"sim": 1, "other": 0}
    assert _by(found, "gpu_portal_cluster_gpu_events_24h", "kind", cluster="sim") == {
        "xid": 2,
        "ecc": 0,
        "lost": 0,
        "layout": 0,
    }
    assert set(_by(found, "gpu_portal_cluster_gpu_events_24h", "kind", cluster="other").values()) == {0}


def test_pool_and_tenant_figures(reported, locked, client):
    found = families(scrape(client))

    acme, globex = str(reported.acme_pool.pk), str(reported.globex_pool.pk)
    assert _samples(found, "gpu_portal_pool_info") == {
        key({"pool": acme, "cluster": "sim", "tenant": "acme", "project": "vision"}): 1,
        key({"pool": globex, "cluster": "sim", "tenant": "globex", "project": "recsys"}): 1,
    }
    # acme holds the full GPU at 50 % SM activity; globex a 3g.40gb instance at 20 %.
    assert _by(found, "gpu_portal_pool_compute_slices", "pool") == {acme: 7, globex: 3}
    assert _by(found, "gpu_portal_pool_sm_active_ratio", "pool") == {
        acme: pytest.approx(0.5),
        globex: pytest.approx(0.2),
    }
    assert _by(found, "gpu_portal_pool_memory_used_bytes", "pool") == {acme: 10 * GIB, globex: GIB}
    assert _by(found, "gpu_portal_tenant_pools", "tenant") == {"acme": 1, "globex": 1}
    assert _by(found, "gpu_portal_tenant_units", "kind", tenant="globex") == {"held": 1, "reporting": 1}
    assert _by(found, "gpu_portal_tenant_compute_slices", "kind", tenant="acme") == {
        "allocated": 7,
        "measured": 7,
        "used": pytest.approx(3.5),
    }
    assert _by(found, "gpu_portal_tenant_memory_used_bytes", "tenant") == {"acme": 10 * GIB, "globex": GIB}
    assert _by(found, "gpu_portal_tenant_memory_total_bytes", "tenant") == {
        "acme": 80 * GIB,
        "globex": 40 * GIB,
    }
    # What the tenants hold adds up to what the fleet page says is allocated, measured and used.
    cluster = _by(found, "gpu_portal_cluster_compute_slices", "kind", cluster="sim")
    for kind in ("allocated", "measured", "used"):
        tenants = sum(_by(found, "gpu_portal_tenant_compute_slices", "tenant", kind=kind).values())
        assert tenants == pytest.approx(cluster[kind])
    assert sum(_by(found, "gpu_portal_pool_compute_slices", "pool").values()) == cluster["allocated"]


def test_a_pools_shares_of_one_gpu_count_the_gpu_once(db, locked, client, tenancy):
    gpu = GpuCapacityFactory(node__gpu_model="L40S-48GB", model="L40S-48GB", mig=None)
    first = PoolFactory(project=tenancy.vision, cluster=gpu.node.cluster)
    second = PoolFactory(project=tenancy.recsys, cluster=gpu.node.cluster)
    for pool, share in ((first, 0), (first, 1), (second, 2)):
        AllocationFactory(pool=pool, gpu=gpu, profile="ts-4", slices=NumericRange(share, share + 1))
    Latest.objects.create(
        gpu=gpu, slot=-1, at=timezone.now(), sm_active_pct=40.0, memory_used_bytes=12 * GIB,
        memory_total_bytes=48 * GIB, source="agent",
    )  # fmt: skip

    found = families(scrape(client))

    assert _by(found, "gpu_portal_pool_compute_slices", "pool") == {str(first.pk): 3.5, str(second.pk): 1.75}
    assert _by(found, "gpu_portal_pool_sm_active_ratio", "pool") == {str(first.pk): 0.4, str(second.pk): 0.4}
    assert _by(found, "gpu_portal_tenant_compute_slices", "kind", tenant="acme") == {
        "allocated": 3.5,
        "measured": 3.5,
        "used": pytest.approx(1.4),
    }
    assert _by(found, "gpu_portal_pool_memory_used_bytes", "pool") == {
        str(first.pk): 12 * GIB,
        str(second.pk): 12 * GIB,
    }
    assert _by(found, "gpu_portal_tenant_units", "kind", tenant="acme") == {"held": 1, "reporting": 1}
    assert _by(found, "gpu_portal_cluster_compute_slices", "kind", cluster=gpu.node.cluster.name)[
        "allocated"
    ] == pytest.approx(5.25)


def test_only_gpus_in_trouble_have_series_of_their_own(reported, locked, client):
    per_gpu = [name for name in families(scrape(client)) if name.startswith("gpu_portal_gpu_")]
    assert len(per_gpu) == 10
    assert not any(families(scrape(client))[name].samples for name in per_gpu)

    _open_fault(reported.cut)
    AlertFactory(gpu=reported.full, severity="critical")
    AlertFactory(gpu=reported.full, rule=AlertRuleFactory(name="Power"), subject=f"gpu:{reported.full.pk}:p")
    AlertFactory(gpu=reported.spare, resolved_at=timezone.now())  # resolved: not in trouble
    found = families(scrape(client))

    acme_gpu = _labels(reported.full, pool=str(reported.acme_pool.pk))
    cut_whole = _labels(reported.cut)
    held = _labels(reported.cut, profile="3g.40gb", mig_start="0", pool=str(reported.globex_pool.pk))
    free = _labels(reported.cut, profile="3g.40gb", mig_start="4")
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
        key(acme_gpu): 10 * GIB,
        key(held): GIB,
        key(free): 2 * GIB,
    }
    assert _samples(found, "gpu_portal_gpu_memory_total_bytes")[key(cut_whole)] == 80 * GIB
    assert _samples(found, "gpu_portal_gpu_ecc_errors") == {
        key({**acme_gpu, "type": "corrected"}): 3.0,
        key({**acme_gpu, "type": "uncorrected"}): 0.0,
    }
    seen = _samples(found, "gpu_portal_gpu_last_seen_timestamp_seconds")
    assert set(seen) == {key(acme_gpu), key(cut_whole), key(held), key(free)}
    assert set(seen.values()) == {NOW.timestamp()}
    assert found["gpu_portal_gpu_power_watts"].type == "gauge"
    where = {"cluster": "sim", "node": "gpu-node-1", "model": "H100-80GB"}
    assert _samples(found, "gpu_portal_gpu_fault_open") == {
        key({**where, "gpu": "1", "uuid": reported.cut.uuid, "kind": "xid"}): 1
    }
    assert _samples(found, "gpu_portal_gpu_alerts_firing") == {
        key({**where, "gpu": "0", "uuid": reported.full.uuid, "severity": "critical"}): 1,
        key({**where, "gpu": "0", "uuid": reported.full.uuid, "severity": "warning"}): 1,
    }
    assert _by(found, "gpu_portal_alerts_firing", "severity") == {"critical": 1, "warning": 1}
    assert reported.spare.uuid not in scrape(client)


def test_nothing_stale_stays(reported, locked, client):
    fault = _open_fault(reported.cut)
    alert = AlertFactory(gpu=reported.full)
    assert reported.cut.uuid in scrape(client) and reported.full.uuid in scrape(client)

    GpuFault.objects.filter(pk=fault.pk).update(cleared_at=timezone.now())
    Alert.objects.filter(pk=alert.pk).update(resolved_at=timezone.now())
    released = timezone.now()
    Allocation.objects.filter(pool=reported.acme_pool).update(released_at=released)
    Pool.objects.filter(pk=reported.acme_pool.pk).update(state=PoolState.RELEASED, released_at=released)
    text = scrape(client)
    found = families(text)

    assert reported.cut.uuid not in text and reported.full.uuid not in text
    assert (
        not found["gpu_portal_gpu_fault_open"].samples and not found["gpu_portal_gpu_alerts_firing"].samples
    )
    assert set(_by(found, "gpu_portal_pool_info", "pool")) == {str(reported.globex_pool.pk)}
    assert set(_by(found, "gpu_portal_tenant_pools", "tenant")) == {"globex"}
    assert _by(found, "gpu_portal_cluster_compute_slices", "kind", cluster="sim")["allocated"] == 3
    assert _by(found, "gpu_portal_alerts_firing", "severity") == {"critical": 0, "warning": 0}


def test_stale_figures_are_left_out(fleet, locked, client):
    ingest(cluster=fleet.cluster, readings=[reading(fleet, at=NOW - timedelta(minutes=30))], source="agent")
    _open_fault(fleet.cut)

    found = families(scrape(client))

    assert (
        not found["gpu_portal_gpu_power_watts"].samples
        and not found["gpu_portal_gpu_sm_active_ratio"].samples
    )
    assert len(found["gpu_portal_gpu_last_seen_timestamp_seconds"].samples) == 3  # the cut GPU and its two
    assert _by(found, "gpu_portal_pool_compute_slices", "pool")[str(fleet.acme_pool.pk)] == 7
    assert _by(found, "gpu_portal_tenant_compute_slices", "kind", tenant="acme") == {
        "allocated": 7,
        "measured": 0,
        "used": 0,
    }
    assert not found["gpu_portal_pool_sm_active_ratio"].samples
    assert not found["gpu_portal_pool_memory_used_bytes"].samples
    assert _by(found, "gpu_portal_tenant_units", "kind", tenant="acme") == {"held": 1, "reporting": 0}
    assert _by(found, "gpu_portal_cluster_gpus", "kind", cluster="sim") == {"present": 2, "reporting": 0}
    assert not found["gpu_portal_cluster_utilisation_ratio"].samples


def test_promtool_finds_no_problem(reported, locked, client, tenancy):
    if not shutil.which(PROMTOOL):
        pytest.fail(f"{PROMTOOL} is missing: install the Debian package `prometheus` (CI installs it).")
    GpuEvent.objects.create(gpu=reported.cut, at=timezone.now(), kind=GpuEvent.Kind.LOST)
    _open_fault(reported.cut, kind=GpuEvent.Kind.LOST)
    AlertFactory(gpu=reported.full)
    PoolRequestFactory(project=tenancy.vision, state=RequestState.QUEUED)
    text = scrape(client)
    assert reported.cut.uuid in text and reported.full.uuid in text  # every family has samples to check

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
    _open_fault(reported.cut)
    scrape(client)
    with CaptureQueriesContext(connection) as few:
        scrape(client)
    node = NodeCapacityFactory(cluster=reported.other, name="n3", gpu_model="H100-80GB")
    for index in range(6):
        gpu = GpuCapacityFactory(node=node, index=index)
        project = tenancy.vision if index % 2 else ProjectFactory(tenant=TenantFactory())
        AllocationFactory(pool=PoolFactory(project=project, cluster=reported.other), gpu=gpu)
        GpuEvent.objects.create(gpu=gpu, at=timezone.now(), kind=GpuEvent.Kind.LOST)
        _open_fault(gpu, kind=GpuEvent.Kind.LOST)
        AlertFactory(gpu=gpu)
    with CaptureQueriesContext(connection) as many:
        text = scrape(client)
    assert text.count("gpu_portal_pool_info{") == 8 and text.count("gpu_portal_gpu_fault_open{") == 7
    statements = [
        q["sql"] for q in many.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert len(many) == len(few) and len(statements) <= 14


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
        "gpu_portal_cluster_power_watts",
        "gpu_portal_cluster_compute_slices",
        "gpu_portal_tenant_compute_slices",
        "gpu_portal_pool_sm_active_ratio",
        "gpu_portal_pool_info",
        "gpu_portal_gpu_fault_open",
        "gpu_portal_metering_lag_seconds",
        "gpu_portal_pools_overdue",
        "gpu_portal_http_request_duration_seconds_bucket",
        "gpu_portal_task_queue_length",
    ):
        assert wanted in used
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert {"cluster", "tenant"} <= set(variables) and "node" not in variables
    assert all(
        panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        for panel in dashboard["panels"]
        if "datasource" in panel
    )


def test_the_dashboard_draws_gpus_one_by_one_only_where_they_are_in_trouble():
    """Per-GPU figures are dcgm-exporter's: the dashboard says so, and reads the portal's per-GPU families
    only in panels about the GPUs in trouble."""
    dashboard = json.loads(DASHBOARD.read_text())
    texts = [panel for panel in dashboard["panels"] if panel["type"] == "text"]
    assert any("dcgm-exporter" in panel["options"]["content"] for panel in texts)
    for panel in dashboard["panels"]:
        names = set().union(set(), *(metric_names(t["expr"]) for t in panel.get("targets", [])))
        if any(name.startswith("gpu_portal_gpu_") for name in names):
            assert "trouble" in panel["title"].lower() and "dcgm-exporter" in panel["description"]
