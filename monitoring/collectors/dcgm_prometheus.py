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
A reading's `at` is the newest sample of its host.

What DCGM gives, in the contract's units (base.py): utilisation (%), SM activity (a ratio, shown in %),
power (W), temperature (°C), memory used and free (MiB; total = used + free), volatile ECC counts (the
aggregate ones when the volatile ones are not exported) and the last XID. A MIG instance has its own
memory and SM activity; the rest belong to its GPU, and when DCGM reports a GPU figure only per
instance, the GPU's stays None (its `problems` say so).

What it cannot give: an instance's placement and its own MIG UUID (dcgm-exporter labels an instance
with its GPU's UUID; `uuid` is ""); whether a GPU without instance series has MIG on (`mig_enabled`
is None then); which pod holds a device (the contract has no place for it). `DCGM_FI_DEV_XID_ERRORS`
keeps the last XID until the driver reloads, so a non-zero one is in every reading's `xid_events`.
A series with neither a `Hostname` nor an `instance` label belongs to no host and is left out.

Where it reads: wherever the session it is given lets it (the portal gives one that reaches only the
addresses it may send requests to, portal/outbound.py), and never where a redirect points: a redirect is
an answer that is not a query result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import requests

from monitoring.collectors.base import CollectorUnavailable, GpuReading, InstanceReading, Reading

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"
POWER = "DCGM_FI_DEV_POWER_USAGE"
TEMPERATURE = "DCGM_FI_DEV_GPU_TEMP"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
ECC_SBE = ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")  # volatile first
ECC_DBE = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")
XID = "DCGM_FI_DEV_XID_ERRORS"
METRICS = (GPU_UTIL, SM_ACTIVE, POWER, TEMPERATURE, FB_USED, FB_FREE, *ECC_SBE, *ECC_DBE, XID)
MIB = 1 << 20
LAST_SECOND = 253402300800  # 10000-01-01: a later time is no sample's


class Figure(NamedTuple):
    field: str  # the GpuReading / InstanceReading attribute
    label: str  # its name in `problems`
    metrics: tuple[str, ...]  # the first one exported is used
    convert: Callable[[float], float | int]


def _bytes(mib: float) -> int:
    return round(mib * MIB)


GPU_FIGURES = (
    Figure("utilisation_pct", "utilisation", (GPU_UTIL,), float),
    Figure("sm_active_pct", "SM activity", (SM_ACTIVE,), lambda ratio: round(ratio * 100, 2)),
    Figure("power_w", "power", (POWER,), float),
    Figure("temperature_c", "temperature", (TEMPERATURE,), float),
    Figure("memory_used_bytes", "memory used", (FB_USED,), _bytes),
    Figure("ecc_corrected", "ECC corrected", ECC_SBE, int),
    Figure("ecc_uncorrected", "ECC uncorrected", ECC_DBE, int),
)
INSTANCE_FIGURES = tuple(f for f in GPU_FIGURES if f.field in ("sm_active_pct", "memory_used_bytes"))
# Free memory only makes the total; the last XID becomes `xid_events`.
FREE = Figure("memory_free_bytes", "memory total", (FB_FREE,), _bytes)
LAST_XID = Figure("xid_events", "XID", (XID,), int)


class Sample(NamedTuple):
    """The newest sample of one series."""

    metric: str
    labels: Mapping[str, str]
    at: float  # seconds since the epoch
    value: float  # may be NaN or infinite: such a series is noted, not used
    raw: str | float


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
        current = _still_exported([s for s in samples if s.at >= oldest])
        hosts: dict[str, _Host] = {}
        for sample in current:
            host = _host_name(sample.labels)
            if host:
                hosts.setdefault(host, _Host()).add(sample)
        return tuple(hosts[name].reading(name) for name in sorted(hosts))

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


def _still_exported(samples: list[Sample]) -> list[Sample]:
    """Drops the series their target no longer exports: older than the target's newest scrape."""
    newest: dict[tuple[str | None, str | None], float] = {}
    for sample in samples:
        target = (sample.labels.get("job"), sample.labels.get("instance"))
        newest[target] = max(newest.get(target, sample.at), sample.at)
    return [s for s in samples if s.at >= newest[(s.labels.get("job"), s.labels.get("instance"))]]


def _host_name(labels: Mapping[str, str]) -> str:
    if labels.get("Hostname"):
        return labels["Hostname"]
    instance = labels.get("instance", "")
    if instance.startswith("["):  # [2001:db8::1]:9400
        return instance[1:].partition("]")[0]
    return instance.partition(":")[0] if instance.count(":") == 1 else instance


# --- from series to readings -------------------------------------------------------------------------


@dataclass
class _Entity:
    """A GPU or a MIG instance: its newest sample of each metric."""

    labels: dict[str, str] = field(default_factory=dict)
    samples: dict[str, Sample] = field(default_factory=dict)

    def add(self, sample: Sample) -> None:
        known = self.samples.get(sample.metric)
        if known is None or sample.at > known.at:
            self.samples[sample.metric] = sample
        self.labels.update(sample.labels)

    def exports(self, figure: Figure) -> bool:
        return any(metric in self.samples for metric in figure.metrics)

    def figure(self, figure: Figure) -> tuple[float | int | None, str | None]:
        """The figure's value, or None and why."""
        for metric in figure.metrics:
            sample = self.samples.get(metric)
            if sample is None:
                continue
            try:
                if math.isfinite(sample.value):
                    return figure.convert(sample.value), None
            except OverflowError:
                pass
            return None, f"{figure.label}: {metric} is {sample.raw}; skipped"
        return None, f"{figure.label}: not exported ({' or '.join(figure.metrics)})"

    def figures(self, figures: tuple[Figure, ...], problems: list[str]) -> dict[str, object]:
        """The figures by attribute, memory total made of used + free; each missing one noted."""
        found: dict[str, object] = {}
        for figure in figures:
            found[figure.field], why = self.figure(figure)
            problems += [why] if why else []
        used, free = found.get("memory_used_bytes"), found.pop(FREE.field)
        found["memory_total_bytes"] = None if used is None or free is None else used + free
        return found


@dataclass
class _Gpu(_Entity):
    uuid: str = ""
    instances: dict[str, _Entity] = field(default_factory=dict)  # by GPU_I_ID as labelled
    names: dict[str, str] = field(default_factory=dict)  # gpu and modelName, whichever series has them

    def add(self, sample: Sample) -> None:
        instance = sample.labels.get("GPU_I_ID")
        if instance is None:
            super().add(sample)
        else:
            self.instances.setdefault(instance, _Entity()).add(sample)
        self.names.update({k: v for k, v in sample.labels.items() if k in ("gpu", "modelName") and v})

    def figure(self, figure: Figure) -> tuple[float | int | None, str | None]:
        if not self.exports(figure) and any(i.exports(figure) for i in self.instances.values()):
            return None, f"{figure.label}: reported per MIG instance only"
        return super().figure(figure)

    def reading(self, host_problems: list[str]) -> GpuReading | None:
        """The GPU's reading; None, with the reason among the host's problems, without an index."""
        index = _number(self.names.get("gpu"))
        if index is None:
            host_problems.append(
                f"GPU {self.uuid}: gpu label {self.names.get('gpu')!r}, not an index; skipped"
            )
            return None
        problems: list[str] = []
        found = self.figures((*GPU_FIGURES, FREE, LAST_XID), problems)
        xid = found.pop(LAST_XID.field)
        return GpuReading(
            index=index,
            uuid=self.uuid,
            model=self.names.get("modelName"),
            mig_enabled=True if self.instances else None,
            xid_events=(xid,) if xid else (),
            instances=self._instances(problems),
            problems=tuple(dict.fromkeys(problems)),
            **found,  # type: ignore[arg-type]
        )

    def _instances(self, gpu_problems: list[str]) -> tuple[InstanceReading, ...]:
        found = []
        for label, entity in self.instances.items():
            instance_id = _number(label)
            if instance_id is None:
                gpu_problems.append(f"MIG instance: GPU_I_ID {label!r} is not a number; skipped")
                continue
            problems: list[str] = []
            figures = entity.figures((*INSTANCE_FIGURES, FREE), problems)
            found.append(
                InstanceReading(
                    uuid="",
                    gpu_instance_id=instance_id,
                    profile=entity.labels.get("GPU_I_PROFILE") or None,
                    problems=tuple(dict.fromkeys(problems)),
                    **figures,  # type: ignore[arg-type]
                )
            )
        return tuple(sorted(found, key=lambda instance: instance.gpu_instance_id))


@dataclass
class _Host:
    at: float = 0.0
    gpus: dict[str, _Gpu] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        self.at = max(self.at, sample.at)
        uuid = sample.labels.get("UUID")
        if not uuid:
            self.problems.append(
                f"{sample.metric} of gpu {sample.labels.get('gpu', '?')}: no UUID label; skipped"
            )
            return
        self.gpus.setdefault(uuid, _Gpu(uuid=uuid)).add(sample)

    def reading(self, host: str) -> Reading:
        gpus = [gpu.reading(self.problems) for gpu in self.gpus.values()]
        return Reading(
            host=host,
            at=datetime.fromtimestamp(self.at, UTC),
            gpus=tuple(sorted((gpu for gpu in gpus if gpu), key=lambda gpu: (gpu.index, gpu.uuid))),
            problems=tuple(dict.fromkeys(self.problems)),
        )


def _number(label: str | None) -> int | None:
    return int(label) if label is not None and label.isascii() and label.isdigit() else None


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
