"""The JSON trace of `manage.py simulate` (docs/traces.md, "Simulation trace"): fleet and timed requests in,
when each request was admitted and where it went out.

The GPUs and each request's id, items and group are read as the placement trace reads them
(pools/placement/trace.py), with the same messages; on top of that a request has `arrive` and `hold` (whole
seconds, 0 or more), requests come in arrival order with unique ids, `horizon` is a whole number of seconds
above 0, and `backfill_grace_seconds` is null (or absent) or a whole number of seconds, 0 or more. Optional:
`tenants` with their quotas, `reclaim_notice_seconds`, `requeue_reclaimed` (true or false), and per request
`tenant` (one of them), `priority` and `declared_hold`. Every
message says where the input is wrong ("requests[3] ('r4'): ..."). Keys the contract does not name are
ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pools.placement.admission import Quota
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
    quotas = _tenants(data, fleet)
    for n, timed in enumerate(requests):
        if timed.tenant is not None and timed.tenant not in quotas:
            known = ", ".join(sorted(quotas)) or "none"
            raise TraceError(
                f'requests[{n}] ({timed.id!r}): "tenant" {timed.tenant!r} is not in "tenants" '
                f"(they are: {known})."
            )
    notice = 900
    if "reclaim_notice_seconds" in data:
        notice = _whole(data, "reclaim_notice_seconds", "the trace", least=0, wanted=_SECONDS)
    requeue = data.get("requeue_reclaimed", False)
    if not isinstance(requeue, bool):
        raise TraceError(f'the trace: "requeue_reclaimed" must be true or false, got {kind_of(requeue)}.')
    return SimulationTrace(fleet, tuple(requests), horizon, grace, quotas, notice, requeue)


def _tenants(data: dict, fleet: Fleet) -> dict[str, dict[tuple[str, str], Quota]]:
    """The trace's tenants, each with its quotas by (group, model): a guarantee and a limit (absent: the
    guarantee; null: none) in compute slices, of a model the fleet holds."""
    models = {gpu.model for gpu in fleet.gpus}
    found: dict[str, dict[tuple[str, str], Quota]] = {}
    for n, raw in enumerate(list_field(data, "tenants", "the trace")):
        where = f"tenants[{n}]"
        if not isinstance(raw, dict):
            raise TraceError(f"{where}: a tenant is an object, not {kind_of(raw)}.")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise TraceError(f'{where}: "name" must be a non-empty string.')
        if name in found:
            raise TraceError(f"{where}: tenant {name!r} appears more than once.")
        where = f"{where} ({name!r})"
        if "auto_approve" in raw and not isinstance(raw["auto_approve"], bool):
            raise TraceError(
                f'{where}: "auto_approve" must be true or false, got {kind_of(raw["auto_approve"])}.'
            )
        quotas: dict[tuple[str, str], Quota] = {}
        for m, entry in enumerate(list_field(raw, "quotas", where)):
            at = f"{where} quotas[{m}]"
            if not isinstance(entry, dict):
                raise TraceError(f"{at}: a quota is an object, not {kind_of(entry)}.")
            group = entry.get("group") or ""
            model = entry.get("model")
            if not isinstance(group, str):
                raise TraceError(f'{at}: "group" must be a string or null, got {kind_of(group)}.')
            if model not in models:
                raise TraceError(
                    f'{at}: "model" {model!r} is not a model of the fleet ({", ".join(sorted(models))}).'
                )
            guaranteed = _whole(
                entry, "guaranteed", at, least=0, wanted="a whole number of compute slices, 0 or more"
            )
            limit = entry.get("limit", guaranteed)
            if limit is not None:
                limit = _whole(
                    {"limit": limit},
                    "limit",
                    at,
                    least=guaranteed,
                    wanted=f"null or at least the guarantee ({guaranteed})",
                )
            if (group, model) in quotas:
                raise TraceError(f"{at}: a second quota for {group or 'no group'} and {model}.")
            quotas[(group, model)] = Quota(guaranteed, limit)
        found[name] = quotas
    return found


def _timed_request(raw: Any, where: str, fleet: Fleet) -> TimedRequest:
    request = read_request(raw, where, fleet)
    where = f"{where} ({request.id!r})"
    tenant = raw.get("tenant")
    if tenant is not None and (not isinstance(tenant, str) or not tenant):
        raise TraceError(f'{where}: "tenant" must be a tenant\'s name or null, got {kind_of(tenant)}.')
    priority = raw.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -1000 <= priority <= 1000:
        raise TraceError(f'{where}: "priority" must be a whole number from -1000 to 1000, got {priority!r}.')
    declared = None
    if raw.get("declared_hold") is not None:
        declared = _whole(raw, "declared_hold", where, least=0, wanted=f"null or {_SECONDS}")
    return TimedRequest(
        id=request.id,
        arrive=_whole(raw, "arrive", where, least=0, wanted=_SECONDS),
        hold=_whole(raw, "hold", where, least=0, wanted=_SECONDS),
        items=request.items,
        group=request.group,
        tenant=tenant,
        priority=priority,
        declared_hold=declared,
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


def write_outcomes(outcomes: Sequence[Outcome], *, quotas: bool = False, requeue: bool = False) -> dict:
    """The answer of docs/traces.md: per request its admission time and, when admitted, its reconfigure and
    assignments as the placement trace writes them; a request never admitted has only id and null. Where
    the trace has tenants (`quotas`), each result also says whether it was borrowed and when it was
    reclaimed; where it requeues reclaimed pools (`requeue`), each result also lists, under "requeued", the
    admissions of what was asked again after each reclaim, written as a result is, without the id."""
    results = []
    for outcome in outcomes:
        result = _result(outcome, quotas)
        if requeue:
            result["requeued"] = [_result(again, quotas, named=False) for again in outcome.requeued]
        results.append(result)
    return {"results": results}


def _result(outcome: Outcome, quotas: bool, *, named: bool = True) -> dict:
    told = {"borrowed": outcome.borrowed, "reclaimed_at": outcome.reclaimed_at} if quotas else {}
    found = {"id": outcome.request} if named else {}
    if outcome.admitted_at is None:
        return {**found, "admitted_at": None, **told}
    return {**found, "admitted_at": outcome.admitted_at, **write_changes(outcome.placement), **told}
