"""/metrics: who may read it (a token, an allowed network while no proxy is trusted, the metrics port alone)
and what it serves: every app's figures through its plugin, then the processes' own. What each app's
families say is tested with the app (tests/monitoring/test_metrics.py, tests/pools/test_metrics.py,
tests/billing/test_metrics.py)."""

import gzip

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from portal import shell

pytestmark = pytest.mark.django_db

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


def test_a_scraper_that_takes_gzip_gets_it(locked, client):
    answer = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", HTTP_ACCEPT_ENCODING="gzip")

    assert answer["Content-Encoding"] == "gzip"
    assert "gpu_portal_pools" in gzip.decompress(answer.content).decode()


# --- what it serves -------------------------------------------------------------------------------


def test_every_apps_figures_are_served_with_the_processes_own(locked, client):
    found = families(scrape(client))

    collectors = [path for path, _collect in shell.metric_collectors()]
    assert collectors == ["pools.metrics.collect", "billing.metrics.collect", "monitoring.metrics.collect"]
    for name in ("gpu_portal_pools", "gpu_portal_metering_lag_seconds", "gpu_portal_cluster_gpus"):
        assert name in found  # pools', billing's and monitoring's
    assert "gpu_portal_http_request_duration_seconds" in found  # the web processes'


def test_an_apps_plugin_is_all_it_takes_to_add_figures(locked, client, monkeypatch):
    def figures():
        yield GaugeMetricFamily("gpu_portal_test_answer", "A figure an app adds.", value=42)

    monkeypatch.setattr(shell, "metric_collectors", lambda: [("tests.portal.test_metrics.figures", figures)])

    found = families(scrape(client))

    assert found["gpu_portal_test_answer"].samples[0].value == 42
    assert "gpu_portal_pools" not in found
