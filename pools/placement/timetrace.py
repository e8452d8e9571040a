"""The JSON trace of `manage.py simulate` (docs/traces.md, "Simulation trace"): fleet and timed requests in,
when each request was admitted and where it went out.

The GPUs and each request's id, items and group are read as the placement trace reads them
(pools/placement/trace.py), with the same messages; on top of that a request has `arrive` and `hold` (whole
seconds, 0 or more), requests come in arrival order with unique ids, `horizon` is a whole number of seconds
above 0, and `backfill_grace_seconds` is null (or absent) or a whole number of seconds, 0 or more. Every
message says where the input is wrong ("requests[3] ('r4'): ..."). Keys the contract does not name are
ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pools.placement.simulation import Outcome, SimulationTrace, TimedRequest
from pools.placement.trace import TraceError, kind_of, list_field, read_fleet, read_request, write_changes
from pools.placement.types import Fleet

__all__ = ["TraceError", "read_simulation_trace", "write_outcomes"]

_MISSING = object()
_SECONDS = "a whole number of seconds, 0 or more"


def read_simulation_trace(data: Any) -> SimulationTrace:
    if not isinstance(data, dict):
        raise TraceError(
            f'A simulation trace is a JSON object with "gpus", "horizon" and "requests", not {kind_of(data)}.'
        )
    fleet = read_fleet(data)
    horizon = _whole(data, "horizon", "the trace", least=1, wanted="a whole number of seconds above 0")
    grace = None
    if data.get("backfill_grace_seconds") is not None:
        grace = _whole(data, "backfill_grace_seconds", "the trace", least=0, wanted=f"null or {_SECONDS}")
    raw_requests = list_field(data, "requests", "the trace", required=True)
    requests: list[TimedRequest] = []
    first_at: dict[str, str] = {}
    for n, raw in enumerate(raw_requests):
        timed = _timed_request(raw, f"requests[{n}]", fleet)
        where = f"requests[{n}] ({timed.id!r})"
        if timed.id in first_at:
            raise TraceError(
                f'{where}: request id {timed.id!r} appears more than once in "requests" '
                f"(first at {first_at[timed.id]})."
            )
        first_at[timed.id] = f"requests[{n}]"
        if requests and timed.arrive < requests[-1].arrive:
            before = requests[-1]
            raise TraceError(
                f'{where}: "arrive" is {timed.arrive}, before the {before.arrive} of the request before it '
                f"({before.id!r}); requests must be in arrival order."
            )
        requests.append(timed)
    return SimulationTrace(fleet, tuple(requests), horizon, grace)


def _timed_request(raw: Any, where: str, fleet: Fleet) -> TimedRequest:
    request = read_request(raw, where, fleet)
    where = f"{where} ({request.id!r})"
    return TimedRequest(
        id=request.id,
        arrive=_whole(raw, "arrive", where, least=0, wanted=_SECONDS),
        hold=_whole(raw, "hold", where, least=0, wanted=_SECONDS),
        items=request.items,
        group=request.group,
    )


def _whole(raw: dict, key: str, where: str, *, least: int, wanted: str) -> int:
    value = raw.get(key, _MISSING)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        if value is _MISSING:
            shown = "nothing"
        elif isinstance(value, int | float) and not isinstance(value, bool):
            shown = repr(value)
        else:
            shown = kind_of(value)
        raise TraceError(f'{where}: "{key}" must be {wanted}, got {shown}.')
    return value


def write_outcomes(outcomes: Sequence[Outcome]) -> dict:
    """The answer of docs/traces.md: per request its admission time and, when admitted, its reconfigure and
    assignments as the placement trace writes them; a request never admitted has only id and null."""
    return {"results": [_result(outcome) for outcome in outcomes]}


def _result(outcome: Outcome) -> dict:
    if outcome.admitted_at is None:
        return {"id": outcome.request, "admitted_at": None}
    return {"id": outcome.request, "admitted_at": outcome.admitted_at, **write_changes(outcome.placement)}
