"""The DCGM collector against answers no Prometheus should give, from a stand-in server: each of those, a
timeout, a closed port, a redirect or an address the portal may not reach is one clear CollectorUnavailable;
odd but well-formed series are read."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest

from monitoring.collectors import CollectorUnavailable, DcgmPrometheusCollector
from monitoring.ingest import collection
from portal import outbound
from tests.monitoring.dcgm_exporter import free_port

# The stand-in Prometheus servers listen on loopback, which the collector reads only when allowed.
pytestmark = pytest.mark.usefixtures("private_networks_allowed")


def unavailable(url: str, **kwargs) -> str:
    """Why the collector cannot read `url`, read as the portal reads (its session, its refusals)."""
    collector = DcgmPrometheusCollector(url, session=outbound.Session(), **kwargs)
    with pytest.raises(CollectorUnavailable) as refused:
        collection.read(collector)
    collector.close()
    message = str(refused.value)
    assert "\n" not in message
    return message


def series(value: object, at: object = 1_790_000_000.5) -> dict:
    labels = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "UUID": "GPU-1", "gpu": "0", "Hostname": "h"}
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": labels, "values": [[at, value]]}]},
    }


@pytest.mark.parametrize(
    ("status", "content_type", "body", "says"),
    [
        (
            200,
            "text/html",
            "<html><body>Grafana login</body></html>",
            "answered something that is not JSON (text/html)",
        ),
        (200, "application/json", '{"status": "success", "data": {', "answered something that is not JSON"),
        (
            400,
            "application/json",
            {
                "status": "error",
                "errorType": "bad_data",
                "error": 'invalid parameter "query": 1:1: parse error',
            },
            'answered HTTP 400 Bad Request: bad_data: invalid parameter "query": 1:1: parse error.',
        ),
        (
            200,
            "application/json",
            {"status": "error", "errorType": "timeout", "error": "query timed out"},
            "refused the query: timeout: query timed out.",
        ),
        (503, "text/plain", "Service Unavailable", "answered HTTP 503 Service Unavailable."),
        (200, "application/json", [], "not a query result: the answer is list, not an object."),
        (200, "application/json", {"status": "success"}, "not a query result: no data."),
        (
            200,
            "application/json",
            {"status": "ok", "data": {}},
            "not a query result: status is 'ok', not 'success'.",
        ),
        (
            200,
            "application/json",
            {"status": "success", "data": {"resultType": "matrix"}},
            "no data.result list.",
        ),
        (
            200,
            "application/json",
            {"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}},
            "data.resultType is 'scalar'",
        ),
        (200, "application/json", series("abc"), "data.result[0].values[0] has value 'abc', not a number."),
        (
            200,
            "application/json",
            series("42", at="soon"),
            "data.result[0].values[0] has time 'soon', not seconds since 1970.",
        ),
    ],
)
def test_an_answer_that_is_not_a_query_result_is_one_clear_line(
    fake_prometheus, status, content_type, body, says
):
    fake = fake_prometheus(status, body, content_type)
    message = unavailable(fake.url)
    assert message.startswith(f"Prometheus at {fake.url} ") and says in message


def test_a_prometheus_that_does_not_answer_in_time_is_one_clear_line(fake_prometheus):
    fake = fake_prometheus(200, series("42"), delay=3)
    started = time.monotonic()
    assert unavailable(fake.url, timeout=0.3) == f"Prometheus at {fake.url} did not answer within 0.3 s."
    assert time.monotonic() - started < 2


def test_a_closed_port_is_one_clear_line():
    url = f"http://127.0.0.1:{free_port()}"
    assert unavailable(url) == f"Prometheus at {url} cannot be reached: Connection refused."


def test_one_request_per_reading_with_the_given_headers_and_credentials_never_shown(fake_prometheus):
    fake = fake_prometheus(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
    collector = DcgmPrometheusCollector(fake.url + "/", headers={"Authorization": "Bearer s3cret"})
    assert collector.readings() == ()
    ((path, headers),) = fake.requests
    query = parse_qs(urlsplit(path).query)["query"][0]
    assert urlsplit(path).path == "/api/v1/query" and headers["Authorization"] == "Bearer s3cret"
    assert query.startswith('{__name__=~"DCGM_FI_DEV_GPU_UTIL|') and query.endswith('"}[120s]')
    assert "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL" in query

    failing = fake_prometheus(500, "boom", "text/plain")
    with_password = failing.url.replace("http://", "http://portal:hunter2@")
    message = unavailable(with_password)
    assert message == f"Prometheus at {failing.url} answered HTTP 500 Internal Server Error."
    assert failing.requests[0][1]["Authorization"].startswith("Basic ")


def test_a_whole_answer_stands_or_falls_not_half_of_it(fake_prometheus):
    good = series("42")["data"]["result"][0]
    body = {
        "status": "success",
        "data": {"resultType": "matrix", "result": [good, {**good, "values": [[1, {}]]}]},
    }
    assert "data.result[1].values[0] has value {}" in unavailable(fake_prometheus(200, body).url)


def test_odd_but_well_formed_series_from_any_prometheus(fake_prometheus):
    """An instant vector, a target named by an IPv6 address, an instance id and a figure out of range."""
    now = time.time()
    target = {"instance": "[2001:db8::7]:9400", "job": "gpu", "UUID": "GPU-9", "gpu": "3"}

    def sample(name: str, value: str, **labels: str) -> dict:
        return {"metric": {"__name__": name, **target, **labels}, "value": [now, value]}

    fake = fake_prometheus(
        200,
        {
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [
                    sample("DCGM_FI_DEV_GPU_TEMP", "55"),
                    sample("DCGM_FI_DEV_FB_USED", "1e308"),
                    sample("DCGM_FI_DEV_FB_USED", "100", GPU_I_ID="x", GPU_I_PROFILE="1g.18gb"),
                ],
            },
        },
    )
    (reading,) = DcgmPrometheusCollector(fake.url).readings()
    (gpu,) = reading.gpus
    assert (reading.host, gpu.index, gpu.temperature_c, gpu.memory_used_bytes) == ("2001:db8::7", 3, 55, None)
    assert reading.at == datetime.fromtimestamp(now, UTC)
    assert "memory used: DCGM_FI_DEV_FB_USED is 1e308; skipped" in gpu.problems
    assert "MIG instance: GPU_I_ID 'x' is not a number; skipped" in gpu.problems
    assert gpu.instances == () and gpu.mig_enabled is True


def test_a_redirect_is_not_followed(fake_prometheus):
    elsewhere = fake_prometheus(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
    moved = fake_prometheus(302, "", "text/plain", headers={"Location": elsewhere.url + "/api/v1/query"})

    message = unavailable(moved.url)

    assert message == f"Prometheus at {moved.url} answered HTTP 302, a redirect; redirects are not followed."
    assert len(moved.requests) == 1 and elsewhere.requests == []


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_a_prometheus_at_an_address_that_is_not_public_is_not_read(host, fake_prometheus, settings):
    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = False
    fake = fake_prometheus(200, {"status": "success", "data": {"resultType": "matrix", "result": []}})
    url = fake.url.replace("127.0.0.1", host)

    message = unavailable(url)

    assert message.startswith(f"Prometheus at {url} is refused: ") and "not a public address" in message
    assert fake.requests == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("ftp://prometheus:9090", "must be http:// or https://"),
        ("prometheus:9090", "must be http:// or https://"),
        ("", "must be http:// or https://"),
        ("http://", "must be http:// or https://"),
        ("http://prometheus:9090/?x=1", "must not carry a query"),
    ],
)
def test_only_an_http_or_https_url_is_accepted(url, says):
    with pytest.raises(ValueError, match=says):
        DcgmPrometheusCollector(url)
