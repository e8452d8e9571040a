"""The portal's own figures and logs: each web request timed by its route and logged with its request id,
the task queue's length on /metrics, and a real worker that logs its tasks in JSON under the id of the web
request that sent them and serves their durations and failures on its own port."""

import json
import logging
import time
import uuid

import pytest
import requests
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from portal import shell
from tests.monitoring.dcgm_exporter import free_port
from tests.ops.workers import default_queue
from tests.pools.conftest import SMALL_FLEET

ROUTE = "t/<slug:slug>/"


def request_count(route: str, status: str) -> float:
    value = REGISTRY.get_sample_value(
        "gpu_portal_http_request_duration_seconds_count", {"method": "GET", "route": route, "status": status}
    )
    return value or 0.0


@pytest.mark.django_db
def test_a_request_is_timed_by_its_route_and_logged_with_its_request_id(client_for, tenancy, caplog):
    before = request_count(ROUTE, "200")
    given = uuid.uuid4().hex
    with caplog.at_level(logging.INFO, logger="portal.requests"):
        response = client_for(tenancy.acme_member).get("/t/acme/", HTTP_X_REQUEST_ID=given)
    assert response.status_code == 200
    assert response["X-Request-ID"] == given
    assert request_count(ROUTE, "200") == before + 1
    (line,) = [record for record in caplog.records if record.name == "portal.requests"]
    assert line.request_id == given
    assert (line.method, line.route, line.status) == ("GET", ROUTE, 200)
    assert "/t/acme/" not in line.getMessage()  # the pattern, never the address (tokens live in some)


@pytest.mark.django_db
def test_an_unusable_request_id_is_replaced_and_addresses_no_route_takes_share_one_label(client):
    before = request_count("unmatched", "404")
    response = client.get("/no/such/page/", HTTP_X_REQUEST_ID="not an id; DROP TABLE")
    assert response.status_code == 404
    assert response["X-Request-ID"] != "not an id; DROP TABLE"
    assert len(response["X-Request-ID"]) == 32 and int(response["X-Request-ID"], 16) >= 0
    assert request_count("unmatched", "404") == before + 1


@pytest.mark.django_db
def test_metrics_show_the_web_figures_and_the_task_queue(client):
    from portal.celery import app

    queue = f"waiting-{uuid.uuid4().hex[:8]}"
    with default_queue(queue), app.connection_for_write() as connection:
        redis = connection.default_channel.client
        try:
            for _ in range(3):  # nobody consumes this queue: the messages stay
                app.send_task("portal.tasks.clear_expired_sessions", queue=queue)
            app.send_task("portal.tasks.clear_expired_sessions", queue=queue, priority=9)
            before = request_count("unmatched", "200")
            client.get("/healthz")
            probes_counted = request_count("unmatched", "200") - before
            client.get("/accounts/login/")
            response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
        finally:
            redis.delete(queue, *(f"{queue}\x06\x16{step}" for step in (3, 6, 9)))
    assert response.status_code == 200
    families = {family.name: family for family in text_string_to_metric_families(response.content.decode())}
    lengths = {
        sample.labels["queue"]: sample.value for sample in families["gpu_portal_task_queue_length"].samples
    }
    assert lengths[queue] == 4
    # Every queue the apps route tasks to is counted beside the default one (provisioning, metering, ...).
    assert set(lengths) == {queue, *(route["queue"] for route in shell.task_routes().values())}
    routes = {
        sample.labels["route"] for sample in families["gpu_portal_http_request_duration_seconds"].samples
    }
    assert "accounts/login/" in routes
    assert probes_counted == 0  # a probe is answered before the timing
    assert "gpu_portal_pools" in families  # the fleet's figures are still there, in the same scrape


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_worker_logs_its_tasks_under_the_web_request_id_and_serves_their_figures(
    tenancy, approver, synced, api_for, tmp_path
):
    from pools.models import Pool
    from pools.services import submit_request
    from portal.celery import app
    from tests.conftest import running_worker

    synced(SMALL_FLEET)
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    queue, port = f"telemetry-{uuid.uuid4().hex[:8]}", free_port()
    shared = tmp_path / "prometheus"
    shared.mkdir()
    (shared / "counter_4242.db").write_bytes(b"left by an earlier run")  # would break the figures if kept
    env = {"LOG_FORMAT": "json", "CELERY_METRICS_PORT": str(port), "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    # what the web sends goes to this worker
    with running_worker(queue, tmp_path, pool="prefork", env=env) as worker, default_queue(queue):
        given = uuid.uuid4().hex
        answer = api_for(approver).post(
            f"/api/v1/pool-requests/{request.pk}/approve/", {}, format="json", HTTP_X_REQUEST_ID=given
        )
        assert answer.status_code == 200, answer.content
        app.send_task("portal.tasks.clear_expired_sessions", args=[1, 2], queue=queue)  # a TypeError
        deadline = time.monotonic() + 60
        provisioned = (
            "gpu_portal_task_duration_seconds_count",
            (("state", "SUCCESS"), ("task", "pools.tasks.provision_pool")),
        )
        failed = (
            "gpu_portal_task_failures_total",
            (("exception", "TypeError"), ("task", "portal.tasks.clear_expired_sessions")),
        )
        while True:
            figures = _scrape(port)
            if figures.get(provisioned) and figures.get(failed):
                break
            assert time.monotonic() < deadline, f"{sorted(figures)[:20]}\n{worker.log.read_text()[-3000:]}"
            time.sleep(0.3)
        log = worker.log.read_text()
    assert Pool.objects.get(request=request).state == "active"
    assert figures[failed] == 1
    sent_by_the_request = {
        line["task_name"] for line in _json_lines(log) if line.get("request_id") == given and line["task_id"]
    }
    # the approval's queue run, and the provisioning that run sent on from the worker
    assert {"pools.tasks.admit_waiting_requests", "pools.tasks.provision_pool"} <= sent_by_the_request
    line = next(line for line in _json_lines(log) if line["task_name"] == "pools.tasks.provision_pool")
    assert set(line) >= {"time", "level", "logger", "message", "request_id", "task_id", "task_name"}
