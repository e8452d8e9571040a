"""The DCGM collector: reads every host's GPUs and MIG instances from the figures the GPU Operator's
dcgm-exporter leaves in a cluster's Prometheus, through Prometheus's HTTP query API.

Words:
- series: one DCGM field for one entity, as Prometheus stores it. An entity is a whole GPU, or a MIG
  instance of it: a series with a `GPU_I_ID` label, whose `UUID` label is its GPU's.
- target: one dcgm-exporter that Prometheus scrapes (its `job` and `instance` labels). All the samples
  of one scrape carry that scrape's timestamp.

How it reads: one instant query for the last `staleness` seconds of every field it uses, as a range
(`{__name__=~"DCGM_FI_DEV_GPU_UTIL|..."}[120s]`), because a range gives each sample its own timestamp
where a plain instant query stamps every answer with the time of the query. Of each series it keeps the
newest sample, and it drops
- a sample older than `staleness` by the collector's clock;
- a series its target stopped exporting (a MIG instance removed by a layout change, a pod that ended):
  its newest sample is older than its target's newest scrape.
A reading's `at` is the newest sample of its host; what becomes of the series is dcgm_series.py's.

Where it reads: wherever the session it is given lets it (the portal gives one that reaches only the
addresses it may send requests to, portal/outbound.py), and never where a redirect points: a redirect is
an answer that is not a query result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import requests

from monitoring.collectors.base import CollectorUnavailable, Reading
from monitoring.collectors.dcgm_series import METRICS, Sample, readings_of

LAST_SECOND = 253402300800  # 10000-01-01: a later time is no sample's


class DcgmPrometheusCollector:
    name = "dcgm"

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        staleness: timedelta | float = timedelta(seconds=120),
        clock: Callable[[], datetime] | None = None,
        headers: Mapping[str, str] | None = None,
        session: requests.Session | None = None,
    ):
        """`url` is Prometheus's base address (http or https, a path prefix allowed; user:password@
        works as basic auth and is never shown); `headers` go with every request (a bearer token);
        `staleness` is a timedelta or seconds; `session` sends the requests (a plain one by default)."""
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"The Prometheus URL must be http:// or https:// with a host, not {url!r}.")
        if parts.query or parts.fragment:
            raise ValueError(f"The Prometheus URL must not carry a query or fragment: {url!r}.")
        self.staleness = staleness if isinstance(staleness, timedelta) else timedelta(seconds=staleness)
        if timeout <= 0 or self.staleness <= timedelta(0):
            raise ValueError("The timeout and the staleness bound must be positive.")
        self.url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2])).rstrip("/")
        self.timeout = timeout
        self._endpoint = url.rstrip("/") + "/api/v1/query"
        window = max(1, math.ceil(self.staleness.total_seconds()))
        self.query = '{__name__=~"%s"}[%ds]' % ("|".join(METRICS), window)  # noqa: UP031 (PromQL braces)
        self._clock = clock or (lambda: datetime.now(UTC))
        self._session = session or requests.Session()
        self._session.headers.update({"Accept": "application/json", **(headers or {})})

    def readings(self) -> tuple[Reading, ...]:
        samples = self._fetch()
        oldest = (self._clock() - self.staleness).timestamp()
        return readings_of([s for s in samples if s.at >= oldest])

    def close(self) -> None:
        self._session.close()

    # --- talking to Prometheus -------------------------------------------------------------------

    def _fetch(self) -> list[Sample]:
        """Every series the query returns, each with its newest sample; any answer that is not a query
        result raises CollectorUnavailable, so a reading is never built from half an answer."""
        where = f"Prometheus at {self.url}"
        try:
            response = self._session.get(
                self._endpoint, params={"query": self.query}, timeout=self.timeout, allow_redirects=False
            )
        except requests.RequestException as error:
            if isinstance(error, requests.Timeout) or "timed out" in str(error).lower():
                raise CollectorUnavailable(f"{where} did not answer within {self.timeout:g} s.") from error
            if isinstance(error, requests.ConnectionError):
                raise CollectorUnavailable(f"{where} cannot be reached: {_cause(error)}.") from error
            raise CollectorUnavailable(f"{where} failed: {_cause(error)}.") from error
        if response.is_redirect:
            raise CollectorUnavailable(
                f"{where} answered HTTP {response.status_code}, a redirect; redirects are not followed."
            )
        if response.status_code != 200:
            detail = _error_text(response)
            raise CollectorUnavailable(
                f"{where} answered HTTP {response.status_code} {response.reason or ''}".rstrip()
                + (f": {detail}." if detail else ".")
            )
        try:
            body = response.json()
        except (ValueError, RecursionError) as error:
            kind = response.headers.get("Content-Type") or "no content type"
            raise CollectorUnavailable(f"{where} answered something that is not JSON ({kind}).") from error
        if isinstance(body, dict) and body.get("status") == "error":
            raise CollectorUnavailable(f"{where} refused the query: {_error_text(response)}.")
        try:
            return _samples(body)
        except _BadShape as error:
            raise CollectorUnavailable(
                f"{where} answered JSON that is not a query result: {error}."
            ) from None


class _BadShape(Exception):
    pass


def _samples(body: object) -> list[Sample]:
    if not isinstance(body, dict):
        raise _BadShape(f"the answer is {type(body).__name__}, not an object")
    if body.get("status") != "success":
        raise _BadShape(f"status is {_short(body.get('status'))}, not 'success'")
    data = body.get("data")
    if not isinstance(data, dict):
        raise _BadShape("no data")
    kind, result = data.get("resultType"), data.get("result")
    if kind not in ("matrix", "vector"):
        raise _BadShape(f"data.resultType is {_short(kind)}, not 'matrix'")
    if not isinstance(result, list):
        raise _BadShape("no data.result list")
    samples = []
    for n, series in enumerate(result):
        where = f"data.result[{n}]"
        if not isinstance(series, dict):
            raise _BadShape(f"{where} is not an object")
        labels = series.get("metric")
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise _BadShape(f"{where}.metric is not a set of labels")
        if not isinstance(labels.get("__name__"), str):
            raise _BadShape(f"{where} has no metric name")
        if kind == "matrix":
            points = series.get("values")
            if not isinstance(points, list) or not points:
                raise _BadShape(f"{where}.values is not a list of samples")
            parsed = [_point(point, f"{where}.values[{i}]") for i, point in enumerate(points)]
        else:
            parsed = [_point(series.get("value"), f"{where}.value")]
        at, value, raw = max(parsed, key=lambda point: point[0])
        samples.append(Sample(labels["__name__"], labels, at, value, raw))
    return samples


def _point(point: object, where: str) -> tuple[float, float, str | float]:
    if not isinstance(point, list | tuple) or len(point) != 2:
        raise _BadShape(f"{where} is not a [time, value] pair")
    at, raw = point
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= at < LAST_SECOND:
        raise _BadShape(f"{where} has time {_short(at)}, not seconds since 1970")
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise _BadShape(f"{where} has value {_short(raw)}, not a number")
    try:
        value = float(raw)  # Prometheus writes numbers as strings: "0.42", "NaN", "+Inf"
    except ValueError:
        raise _BadShape(f"{where} has value {_short(raw)}, not a number") from None
    return float(at), value, raw


# --- one-line messages -------------------------------------------------------------------------------


def _short(value: object, limit: int = 80) -> str:
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _cause(error: Exception) -> str:
    """The operating system's words when there are some ("Connection refused"), else the first line."""
    text = str(error)
    found = re.search(r"\[Errno -?\d+\] ([^'\"()\]]+)", text)
    words = found[1] if found else (text.splitlines() or [type(error).__name__])[0]
    return " ".join(words.split())[:200].rstrip(". ")


def _error_text(response: requests.Response) -> str:
    """Prometheus's own explanation ("bad_data: parse error ..."), if its answer carries one."""
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return ""
    if not isinstance(body, dict) or not body.get("error"):
        return ""
    kind = body.get("errorType")
    text = f"{kind}: {body['error']}" if kind else str(body["error"])
    return " ".join(text.split())[:300]
