"""Seeded placement traces for bench/placement.py: a fleet in some state of use and a queue of requests.

Words used here:
- trace: a fleet and a queue of requests, as in the "Placement trace" of docs/traces.md.
- wholly free GPU: a GPU with nothing allocated on it (MIG off and free, or MIG on with every instance
  free). Only such a GPU may change its layout; any other GPU keeps its instances, and only the free ones
  among them can be given out.
- size class: the compute slices of a profile ("1g", "2g", "3g", "4g", "7g"), or "full" for a whole GPU
  with MIG off. A request names the catalogue profile of its size class on its GPU model.
- admitted compute slices: what the benchmark scores, the compute slices of every placed request
  (a whole GPU counts 7).

Everything is a function of the seed: the same seed gives the same trace.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

from pools import mig
from pools.kinds import compute_slices as profile_compute_slices

MODELS = ("H100-80GB", "H200-141GB")
GPUS_PER_NODE = 8
# Size classes a request asks for, and how often: small instances are the common ones.
REQUEST_SIZES: dict[str, int] = {"1g": 32, "2g": 24, "3g": 16, "4g": 10, "7g": 6, "full": 12}
UNIT_COUNTS: dict[int, int] = {1: 55, 2: 25, 3: 12, 4: 8}
MULTI_ITEM_SHARE = 0.15
# What each GPU of a fresh fleet is doing; the partitioned ones draw a random valid layout.
# Sized so that a queue of 100 asks for about 1.5–2 times the free compute slices of 8–12 nodes.
GPU_STATES: dict[str, int] = {"full-used": 20, "full-free": 30, "mig-free": 15, "mig-used": 35}
INSTANCE_IN_USE = 0.5


@dataclass(frozen=True)
class TraceInstance:
    profile: str
    start: int
    allocated: bool = False


@dataclass(frozen=True)
class TraceGpu:
    id: str
    node: str
    model: str
    mig: bool
    allocated: bool = False  # MIG off: the whole GPU is in use
    instances: tuple[TraceInstance, ...] = ()
    cluster: str = ""

    @property
    def wholly_free(self) -> bool:
        return not self.allocated and not any(instance.allocated for instance in self.instances)


@dataclass(frozen=True)
class TraceItem:
    model: str
    profile: str  # a MIG profile of the model, or mig.FULL_GPU
    count: int


@dataclass(frozen=True)
class TraceRequest:
    id: str
    items: tuple[TraceItem, ...]


@dataclass(frozen=True)
class Trace:
    seed: int
    gpus: tuple[TraceGpu, ...]
    requests: tuple[TraceRequest, ...]


def size_profiles(model_name: str) -> dict[str, str]:
    """Size class → profile name on this model: the catalogue profile of that many compute slices with the
    fewest memory slices and no media extension ("1g" is "1g.10gb", not "1g.20gb", on an H100)."""
    model = mig.gpu_model(model_name)
    chosen: dict[str, str] = {}
    for compute in sorted({p.compute_slices for p in model.profiles.values()}):
        candidates = [
            p for p in model.profiles.values() if p.compute_slices == compute and not p.media_extension
        ]
        chosen[f"{compute}g"] = min(candidates, key=lambda p: p.memory_slices).name
    chosen[mig.FULL_GPU] = mig.FULL_GPU
    return chosen


def request_compute_slices(request: TraceRequest) -> int:
    return sum(item.count * profile_compute_slices(item.model, item.profile) for item in request.items)


def free_compute_slices(gpus: tuple[TraceGpu, ...]) -> int:
    """Compute slices not in use: whole free GPUs count 7, partly used ones their free instances."""
    total = 0
    for gpu in gpus:
        if gpu.wholly_free:
            total += mig.COMPUTE_SLICES
        else:
            total += sum(
                profile_compute_slices(gpu.model, i.profile) for i in gpu.instances if not i.allocated
            )
    return total


def random_layout(rng: random.Random, model_name: str) -> list[mig.Instance]:
    """A valid layout of common profiles, grown by random additions until a few of them no longer fit."""
    model = mig.gpu_model(model_name)
    profiles = [name for size, name in size_profiles(model_name).items() if size != mig.FULL_GPU]
    counts: Counter[str] = Counter()
    for _ in range(12):
        trial = counts + Counter({rng.choice(profiles): 1})
        if mig.place_profiles(model, trial) is not None:
            counts = trial
    layout = mig.place_profiles(model, counts)
    assert layout is not None  # counts only ever grew by placeable additions
    return layout


def random_gpu(rng: random.Random, gpu_id: str, node: str, model: str) -> TraceGpu:
    state = rng.choices(list(GPU_STATES), weights=list(GPU_STATES.values()))[0]
    if state.startswith("full"):
        return TraceGpu(gpu_id, node, model, mig=False, allocated=state == "full-used")
    layout = random_layout(rng, model)
    in_use = [state == "mig-used" and rng.random() < INSTANCE_IN_USE for _ in layout]
    if state == "mig-used" and not any(in_use):
        in_use[rng.randrange(len(layout))] = True
    instances = tuple(TraceInstance(i.profile, i.start, used) for i, used in zip(layout, in_use, strict=True))
    return TraceGpu(gpu_id, node, model, mig=True, instances=instances)


def random_fleet(rng: random.Random, nodes: int) -> tuple[TraceGpu, ...]:
    """Whole nodes of one model each, H100 and H200 mixed."""
    gpus = []
    for n in range(nodes):
        node = f"node-{n + 1:03d}"
        model = rng.choice(MODELS)
        gpus.extend(random_gpu(rng, f"{node}/{g}", node, model) for g in range(GPUS_PER_NODE))
    return tuple(gpus)


def random_request(rng: random.Random, request_id: str, model_weights: dict[str, int]) -> TraceRequest:
    model = rng.choices(list(model_weights), weights=list(model_weights.values()))[0]
    profiles = size_profiles(model)
    item_count = 2 if rng.random() < MULTI_ITEM_SHARE else 1
    sizes: list[str] = []
    while len(sizes) < item_count:
        size = rng.choices(list(REQUEST_SIZES), weights=list(REQUEST_SIZES.values()))[0]
        if size not in sizes:
            sizes.append(size)
    items = tuple(
        TraceItem(
            model, profiles[size], rng.choices(list(UNIT_COUNTS), weights=list(UNIT_COUNTS.values()))[0]
        )
        for size in sizes
    )
    return TraceRequest(request_id, items)


def random_trace(seed: int, *, nodes: int | None = None, requests: int = 100) -> Trace:
    """A fleet of `nodes` × 8 GPUs (8–12 nodes when not given) and a queue of `requests` requests whose models
    follow the fleet's mix."""
    rng = random.Random(seed)
    gpus = random_fleet(rng, nodes if nodes is not None else rng.randint(8, 12))
    model_weights = Counter(gpu.model for gpu in gpus)
    queue = tuple(random_request(rng, f"r{i + 1:03d}", dict(model_weights)) for i in range(requests))
    return Trace(seed, gpus, queue)
