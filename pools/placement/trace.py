"""The JSON trace of `manage.py place` (docs/traces.md, "Placement trace"): fleet and requests in, placements
out.

Reading checks everything the engine relies on and says where the input is wrong ("gpus[2] ('n1/2'): ..."):
known models and profiles, layouts the catalogue accepts, positive counts, unique GPU and request ids.
Keys the contract does not name are ignored, so that additions to it do not break older readers.
The simulation trace (pools/placement/timetrace.py) reads its GPUs and requests with the same readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pools.gpu_models import UnknownGpuModel, model_info
from pools.kinds import DEFAULT_OFFERS, parse_offers, share_kind
from pools.kinds import kind_of as kind_of_profile
from pools.mig import Instance, layout_errors
from pools.placement.engine import validate_request
from pools.placement.plan import share_slots
from pools.placement.types import Fleet, Gpu, Item, Placement, Request, Slot


class TraceError(ValueError):
    """A trace (the input of `manage.py place` or `simulate`) that is not what docs/traces.md describes; the
    message says where."""


_MISSING = object()


def read_trace(data: Any) -> tuple[Fleet, list[Request]]:
    if not isinstance(data, dict):
        raise TraceError(f'A trace is a JSON object with "gpus" and "requests", not {kind_of(data)}.')
    fleet = read_fleet(data)
    requests = [
        read_request(raw, f"requests[{n}]", fleet)
        for n, raw in enumerate(list_field(data, "requests", "the trace"))
    ]
    ids: set[str] = set()
    for request in requests:
        if request.id in ids:
            raise TraceError(f'Request id {request.id!r} appears more than once in "requests".')
        ids.add(request.id)
    return fleet, requests


def read_fleet(data: dict) -> Fleet:
    """The GPUs of a trace (its "gpus"), each checked, their ids unique; shared with the simulation trace."""
    gpus = tuple(
        _gpu(raw, f"gpus[{n}]") for n, raw in enumerate(list_field(data, "gpus", "the trace", required=True))
    )
    seen: set[str] = set()
    modes: dict[tuple[str, str], str] = {}
    for gpu in gpus:
        if gpu.id in seen:
            raise TraceError(f'GPU id {gpu.id!r} appears more than once in "gpus".')
        seen.add(gpu.id)
        mode = modes.setdefault((gpu.cluster, gpu.node), gpu.sharing)
        if mode != gpu.sharing:
            raise TraceError(
                f"GPU {gpu.id!r}: node {gpu.node!r} is in share modes {mode or 'none'} and "
                f"{gpu.sharing or 'none'}; the device plugin shares a node one way, so its GPUs give one "
                '"sharing".'
            )
    return Fleet(gpus)


def _gpu(raw: Any, where: str) -> Gpu:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: a GPU is a JSON object, not {kind_of(raw)}.")
    gpu_id = _text(raw, "id", where)
    where = f"{where} ({gpu_id!r})"
    model_name = _text(raw, "model", where)
    try:
        model = model_info(model_name)
    except UnknownGpuModel as error:
        raise TraceError(f"{where}: {error}") from None
    mig = _flag(raw, "mig", where, default=_MISSING)
    sharing = _sharing(raw, where)
    slots = tuple(
        _slot(item, f"{where} instances[{n}]") for n, item in enumerate(list_field(raw, "instances", where))
    )
    gpu = Gpu(
        id=gpu_id,
        node=_text(raw, "node", where),
        model=model.name,
        mig=mig,
        allocated=_flag(raw, "allocated", where, default=False),
        instances=tuple(sorted(slots, key=lambda slot: slot.start)),
        group=_optional_text(raw, "group", where),
        cluster=_optional_text(raw, "cluster", where) or "",
        schedulable=_flag(raw, "schedulable", where, default=True),
        reconfiguring=_flag(raw, "reconfiguring", where, default=False),
        sharing=sharing,
        offers=_offers(raw, where),
    )
    if not mig and sharing:
        return _shared(gpu, where)
    if slots and not mig:
        raise TraceError(f"{where}: MIG is off, so it cannot have MIG instances.")
    if mig and model.mig is None:
        raise TraceError(f"{where}: the MIG catalogue has no geometry for {model.name}, so MIG cannot be on.")
    errors = layout_errors(model.mig, [Instance(s.start, s.profile) for s in slots]) if model.mig else []
    if errors:
        raise TraceError(f"{where}: this layout does not fit on one {model.name}: {' '.join(errors)}")
    return gpu


def _sharing(raw: dict, where: str) -> str:
    """The optional "sharing" of a GPU: its node's share mode (ts-N, mps-N), or nothing."""
    sharing = _optional_text(raw, "sharing", where) or ""
    if sharing:
        try:
            share_kind(sharing).replicas(sharing)
            parse_offers([sharing])
        except ValueError as error:
            raise TraceError(f'{where}: "sharing" {sharing!r} is no share mode: {error}') from None
    return sharing


def _offers(raw: dict, where: str) -> tuple[str, ...]:
    if "offers" not in raw:
        return DEFAULT_OFFERS
    try:
        return parse_offers(raw["offers"])
    except ValueError as error:
        raise TraceError(f'{where}: "offers": {error}') from None


def _shared(gpu: Gpu, where: str) -> Gpu:
    """A MIG-off GPU of a shared node: its shares, given (each with "allocated") or all free."""
    expected = share_slots(gpu.sharing)
    if gpu.instances and [(s.profile, s.start) for s in gpu.instances] != list(expected):
        raise TraceError(
            f"{where}: in share mode {gpu.sharing} a GPU has the shares {gpu.sharing} at 0 to "
            f"{len(expected) - 1}, each once."
        )
    if gpu.allocated:
        raise TraceError(f'{where}: a shared GPU is in use through its shares, not "allocated".')
    return replace(gpu, instances=gpu.instances or tuple(Slot(profile, start) for profile, start in expected))


def _slot(raw: Any, where: str) -> Slot:
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: an instance is a JSON object, not {kind_of(raw)}.")
    return Slot(
        profile=_text(raw, "profile", where),
        start=whole_number(raw, "start", where),
        allocated=_flag(raw, "allocated", where, default=False),
    )


def read_request(raw: Any, where: str, fleet: Fleet) -> Request:
    """One request of a trace at `where` ("requests[3]"): its id, items and group, checked as the engine
    checks them; the message of a bad one names it ("requests[3] ('r4'): ...")."""
    if not isinstance(raw, dict):
        raise TraceError(f"{where}: a request is a JSON object, not {kind_of(raw)}.")
    request_id = _text(raw, "id", where)
    where = f"{where} ({request_id!r})"
    items = []
    for n, item in enumerate(list_field(raw, "items", where, required=True)):
        item_where = f"{where} items[{n}]"
        if not isinstance(item, dict):
            raise TraceError(f"{item_where}: an item is a JSON object, not {kind_of(item)}.")
        items.append(
            Item(
                model=_text(item, "model", item_where),
                profile=_text(item, "profile", item_where),
                count=whole_number(item, "count", item_where),
            )
        )
    request = Request(id=request_id, items=tuple(items), group=_optional_text(raw, "group", where))
    errors = validate_request(request, fleet)
    if errors:
        raise TraceError(f"{where}: {' '.join(errors)}")
    return request


def write_results(placements: Sequence[Placement]) -> dict:
    return {"results": [_result(placement) for placement in placements]}


def _result(placement: Placement) -> dict:
    if not placement.placed:
        return {"id": placement.request, "placed": False, "reason": placement.reason}
    return {"id": placement.request, "placed": True, **write_changes(placement)}


def write_changes(placement: Placement) -> dict:
    """A placed request's "reconfigure" and "assignments", as both traces' answers write them."""
    return {
        "reconfigure": [
            {
                "gpu": change.gpu,
                "mig": change.mig,
                "instances": [{"profile": profile, "start": start} for profile, start in change.instances],
            }
            | ({"sharing": change.sharing} if not change.mig and change.sharing else {})
            for change in placement.reconfigure
        ],
        "assignments": [
            {"gpu": a.gpu, "profile": a.profile}
            if kind_of_profile(a.profile).takes_whole_gpu
            else {"gpu": a.gpu, "profile": a.profile, "start": a.start}
            for a in placement.assignments
        ],
    }


def kind_of(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "true or false", type(None): "null"}
    return names.get(type(value), "a number")


def list_field(raw: dict, key: str, where: str, *, required: bool = False) -> list:
    value = raw.get(key, _MISSING)
    if value is _MISSING and not required:
        return []
    if not isinstance(value, list):
        shown = "nothing" if value is _MISSING else kind_of(value)
        raise TraceError(f'{where}: "{key}" must be a list, got {shown}.')
    return value


def _text(raw: dict, key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        if key not in raw:
            shown = "nothing"
        else:
            shown = kind_of(value) if not isinstance(value, str) else "an empty string"
        raise TraceError(f'{where}: "{key}" must be a non-empty string, got {shown}.')
    return value


def _optional_text(raw: dict, key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise TraceError(f'{where}: "{key}" must be a string or null, got {kind_of(value)}.')
    return value


def _flag(raw: dict, key: str, where: str, *, default: Any) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        shown = "nothing" if value is _MISSING else kind_of(value)
        raise TraceError(f'{where}: "{key}" must be true or false, got {shown}.')
    return value


def whole_number(raw: dict, key: str, where: str) -> int:
    value = raw.get(key, _MISSING)
    if isinstance(value, bool) or not isinstance(value, int):
        if value is _MISSING:
            shown = "nothing"
        else:
            shown = kind_of(value) if not isinstance(value, float) else repr(value)
        raise TraceError(f'{where}: "{key}" must be a whole number, got {shown}.')
    return value
