"""Allocation of ResourceClaims in the test API server, as the scheduler's DRA plugin does it: devices of
the published ResourceSlices that match a claim's device class and CEL selectors, never two claims on one
device.

Words used here (as `resource.k8s.io/v1` uses them):
- request: one entry of a claim's `spec.devices.requests`; only `exactly` requests are served here, for
  one device each (`allocationMode` ExactCount, `count` 1);
- selector: a CEL expression over one `device`, from the device class and from the request; a device
  matches when all of them are true;
- allocation: `status.allocation` of a claim: per request the driver, pool and device picked, and the
  node the pool belongs to;
- problem: why a claim stays unallocated, kept by the server for tests to read (`claim_problem`): a real
  `ResourceClaimStatus` has no conditions, and the scheduler reports on the pods that wait, not here;
- outcome: `allocate` (the default) or `pending`, which a test forces on one claim to keep it unallocated.

The CEL served is a small subset: `&&` of equalities between string literals (in single or double quotes),
`device.driver` and a string attribute, `device.attributes["<domain>"].<name>`, such as
`device.attributes["gpu.nvidia.com"].uuid == "MIG-..."`. Any other expression leaves the claim unallocated
with the problem "unsupported CEL expression". A device that lacks the attribute, or has it with another
type, does not match (where real CEL would fail the evaluation).

Allocation is immediate: right after a claim, a slice or a device class is written, every unallocated claim
is tried again, least recently written first; so deleting a claim frees its devices for the claims that
wait. Of the free devices that match, the first one (by slice, then by the order in the slice) is picked, as
the scheduler does. Not imitated: `firstAvailable`, counts other than 1, `All` mode, constraints, config,
admin access, taints, consumable capacity, pods and `reservedFor`, and dropping an allocation whose device
went away.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from copy import deepcopy
from dataclasses import dataclass

from tests.kube import objects
from tests.kube.store import ClusterStore, Key

OUTCOMES = ("allocate", "pending")
_STRING = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'"""
_OPERAND = re.compile(
    rf"""\s*(?:(?P<driver>device\.driver)"""
    rf"""|device\.attributes\[\s*(?P<domain>{_STRING})\s*\]\.(?P<name>[A-Za-z_][A-Za-z0-9_]*)"""
    rf"""|(?P<literal>{_STRING}))\s*"""
)
_EQUALS = re.compile(r"\s*==\s*")
_AND = re.compile(r"\s*&&\s*")


class UnsupportedSelector(ValueError):
    """A CEL expression outside the subset served here."""


@dataclass(frozen=True)
class Device:
    driver: str
    pool: str
    node: str
    spec: dict

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.spec["name"])


Operand = Callable[[Device], str | None]
Selector = Callable[[Device], bool]


def _operand(match: re.Match) -> Operand:
    if match["driver"]:
        return lambda device: device.driver
    if match["literal"]:
        value = ast.literal_eval(match["literal"])
        return lambda device: value
    domain, name = ast.literal_eval(match["domain"]), match["name"]

    def attribute(device: Device) -> str | None:
        qualified = name if domain == device.driver else f"{domain}/{name}"
        return (device.spec.get("attributes", {}).get(qualified) or {}).get("string")

    return attribute


def _equality(expression: str, position: int) -> tuple[Selector, int]:
    left = _OPERAND.match(expression, position)
    equals = left and _EQUALS.match(expression, left.end())
    right = equals and _OPERAND.match(expression, equals.end())
    if not right:
        raise UnsupportedSelector(expression)
    read_left, read_right = _operand(left), _operand(right)

    def equal(device: Device) -> bool:
        value = read_left(device)
        return value is not None and value == read_right(device)

    return equal, right.end()


def compile_selector(expression: str) -> Selector:
    """The CEL subset described above, as a predicate over a device; UnsupportedSelector otherwise."""
    terms: list[Selector] = []
    position = 0
    while True:
        term, position = _equality(expression, position)
        terms.append(term)
        if position == len(expression):
            return lambda device: all(term(device) for term in terms)
        joiner = _AND.match(expression, position)
        if joiner is None:
            raise UnsupportedSelector(expression)
        position = joiner.end()


def _selectors(entries: list) -> list[Selector]:
    return [
        compile_selector(str(((entry or {}).get("cel") or {}).get("expression") or "")) for entry in entries
    ]


def _result_keys(claim: dict) -> Iterator[tuple[str, str, str]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or []:
        yield (result.get("driver"), result.get("pool"), result.get("device"))


def _node_selector(node: str) -> dict:
    field = {"key": "metadata.name", "operator": "In", "values": [node]}
    return {"nodeSelectorTerms": [{"matchFields": [field]}]}


class ClaimAllocator:
    """Allocates claims whenever what they depend on is written. Callers hold the store's lock."""

    def __init__(self, store: ClusterStore) -> None:
        self._store = store
        self._outcomes: dict[Key, str] = {}
        self._problems: dict[Key, str] = {}
        self._allocating = False
        store.observers.append(self._observe)

    def set_outcome(self, namespace: str, name: str, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        if outcome == "allocate":
            self._outcomes.pop((namespace, name), None)
        else:
            self._outcomes[(namespace, name)] = outcome
        self.allocate_waiting()

    def problem(self, namespace: str, name: str) -> str | None:
        return self._problems.get((namespace, name))

    def allocate_waiting(self) -> None:
        if self._allocating:
            return
        self._allocating = True
        try:
            self._allocate_all()
        finally:
            self._allocating = False

    def _observe(self, kind: str, obj: dict) -> None:
        if kind in ("ResourceClaim", "ResourceSlice", "DeviceClass"):
            self.allocate_waiting()

    def _allocate_all(self) -> None:
        claims = self._store.by_key("ResourceClaim")
        self._problems = {key: problem for key, problem in self._problems.items() if key in claims}
        taken = {device for claim in claims.values() for device in _result_keys(claim)}
        waiting = [claim for claim in claims.values() if not (claim.get("status") or {}).get("allocation")]
        waiting.sort(key=lambda claim: int(claim["metadata"]["resourceVersion"]))
        devices = list(self._devices())
        for claim in waiting:
            key = (claim["metadata"]["namespace"], claim["metadata"]["name"])
            if self._outcomes.get(key) == "pending":
                self._problems[key] = "kept pending by the test"
                continue
            try:
                picked = self._pick(claim, devices, taken)
            except UnsupportedSelector as error:
                self._problems[key] = f"unsupported CEL expression: {error}"
                continue
            except LookupError as error:
                self._problems[key] = str(error)
                continue
            self._problems.pop(key, None)
            taken.update(device.key for _, device in picked)
            self._store.update(self._allocated(claim, picked))

    def _devices(self) -> Iterator[Device]:
        for key in self._store.keys("ResourceSlice"):
            spec = self._store.by_key("ResourceSlice")[key].get("spec") or {}
            pool = (spec.get("pool") or {}).get("name") or ""
            for device in spec.get("devices") or []:
                yield Device(spec.get("driver") or "", pool, spec.get("nodeName") or "", device)

    def _pick(self, claim: dict, devices: list[Device], taken: set) -> list[tuple[str, Device]]:
        """(request name, device) for every request of the claim; LookupError when one cannot be met."""
        picked: list[tuple[str, Device]] = []
        busy = set(taken)
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            exactly = request.get("exactly")
            if (
                exactly is None
                or exactly.get("count", 1) != 1
                or exactly.get("allocationMode", "ExactCount") != "ExactCount"
            ):
                raise LookupError(
                    f"request {request.get('name')!r}: only `exactly` for one device is served here"
                )
            device_class = self._store.get("DeviceClass", exactly.get("deviceClassName") or "")
            if device_class is None:
                raise LookupError(f"device class {exactly.get('deviceClassName')!r} not found")
            selectors = _selectors((device_class.get("spec") or {}).get("selectors") or [])
            selectors += _selectors(exactly.get("selectors") or [])
            device = next(
                (d for d in devices if d.key not in busy and all(select(d) for select in selectors)), None
            )
            if device is None:
                raise LookupError(f"request {request.get('name')!r}: no free device matches")
            busy.add(device.key)
            picked.append((request["name"], device))
        return picked

    @staticmethod
    def _allocated(claim: dict, picked: list[tuple[str, Device]]) -> dict:
        results = [
            {"request": request, "driver": device.driver, "pool": device.pool, "device": device.spec["name"]}
            for request, device in picked
        ]
        allocation: dict = {"devices": {"results": results}, "allocationTimestamp": objects.now()}
        nodes = {device.node for _, device in picked}
        if len(nodes) == 1 and "" not in nodes:
            allocation["nodeSelector"] = _node_selector(nodes.pop())
        return {
            **claim,
            "metadata": deepcopy(claim["metadata"]),
            "status": {**(claim.get("status") or {}), "allocation": allocation},
        }
