"""Seeded time traces for bench/simulate.py: a fleet of whole free GPUs and a week of requests that arrive,
hold what they are given for hours to days, and leave.

Words used here (the simulator's are pools/placement/simulation.py's):
- offered load: what the requests ask for over what the fleet has, compute slices × hold summed over the
  requests, over the fleet's compute slices × the horizon. Above 1 the queue cannot serve everything.
- arrivals: a Poisson process with `requests` expected over the horizon (exponential gaps, times rounded
  down to whole seconds).
- items: drawn as bench/placement_trace.py draws a queue's (size classes, unit counts, the share of
  requests with two items, one model per request), the model in proportion to the fleet's GPUs of it.
- holds: log-uniform between HOLD_MIN and HOLD_MAX (each doubling of a hold as likely as the next), all
  stretched by one factor of the trace's shape so that the expected offered load is `load` whatever the
  number of requests. Unstretched, 600 such requests a week would offer about 0.78 × a fleet of 64 GPUs;
  stretched to 1.3 ×, holds run from about 1.7 hours to 5 days.
- declared holds: a `declared` share of the requests declare an end date, drawn apart from the rest of the
  trace (the same seed gives the same requests and holds whatever the share). A declared hold is the hold
  stretched by up to DECLARED_SLACK (uniformly; a trace may ask for another slack): its pool ends on time
  or early, never late, so that the pools hold what they would without declaring and only what placement
  knows changes.

Everything is a function of the seed and the shape: the same seed gives the same trace.
"""

from __future__ import annotations

import math
import random
from collections import Counter

from bench.placement_trace import (
    GPUS_PER_NODE,
    MULTI_ITEM_SHARE,
    REQUEST_SIZES,
    UNIT_COUNTS,
    profile_compute_slices,
    random_request,
)
from pools import mig
from pools.placement.simulation import SimulationTrace, TimedRequest
from pools.placement.types import Fleet, Gpu, Item

WEEK = 7 * 24 * 3600
HOUR = 3600
HOLD_MIN = HOUR
HOLD_MAX = 72 * HOUR
NODES = 8
REQUESTS = 600  # expected over the horizon
LOAD = 1.3
# Each node is one model; the first half of the nodes H100, the rest H200.
FLEET_MODELS = ("H100-80GB", "H200-141GB")
# The portal's default QUEUE_BACKFILL_GRACE_SECONDS (pools/conf.py).
BACKFILL_GRACE_SECONDS = 1800
# A declared hold is up to this share longer than the true one: pools end on time or early.
DECLARED_SLACK = 0.25


def whole_free_fleet(nodes: int) -> Fleet:
    """`nodes` × 8 GPUs, MIG off and free, one model per node: the first half H100, the rest H200."""
    gpus = []
    for n in range(nodes):
        node = f"node-{n + 1}"
        model = FLEET_MODELS[0] if n < (nodes + 1) // 2 else FLEET_MODELS[1]
        gpus.extend(Gpu(f"{node}/{g}", node, model, mig=False) for g in range(GPUS_PER_NODE))
    return Fleet(tuple(gpus))


def expected_request_slices() -> float:
    """Compute slices one request asks for on average, from the static bench's tables: one item, or
    (MULTI_ITEM_SHARE) two of different size classes; each so many units of its size class."""
    sizes = {size: weight / sum(REQUEST_SIZES.values()) for size, weight in REQUEST_SIZES.items()}
    slices = {size: profile_compute_slices(FLEET_MODELS[0], _class_profile(size)) for size in sizes}
    units = sum(count * weight for count, weight in UNIT_COUNTS.items()) / sum(UNIT_COUNTS.values())
    one = sum(p * slices[s] for s, p in sizes.items())
    # The second size is drawn again until it differs from the first.
    second = sum(
        p1 * sum(p2 * slices[s2] for s2, p2 in sizes.items() if s2 != s1) / (1 - p1)
        for s1, p1 in sizes.items()
    )
    return units * ((1 - MULTI_ITEM_SHARE) * one + MULTI_ITEM_SHARE * (one + second))


def _class_profile(size: str) -> str:
    if size == mig.FULL_GPU:
        return mig.FULL_GPU
    model = mig.gpu_model(FLEET_MODELS[0])
    return next(p.name for p in model.profiles.values() if f"{p.compute_slices}g" == size)


def hold_stretch(*, gpus: int, horizon: int, requests: float, load: float) -> float:
    """The factor on the base holds that makes the expected offered load `load`."""
    mean_hold = (HOLD_MAX - HOLD_MIN) / math.log(HOLD_MAX / HOLD_MIN)
    capacity = gpus * mig.COMPUTE_SLICES * horizon
    return load * capacity / (requests * expected_request_slices() * mean_hold)


def random_simulation_trace(
    seed: int,
    *,
    nodes: int = NODES,
    horizon: int = WEEK,
    requests: float = REQUESTS,
    load: float = LOAD,
    backfill_grace_seconds: int | None = BACKFILL_GRACE_SECONDS,
    declared: float = 0.0,
    slack: float = DECLARED_SLACK,
) -> SimulationTrace:
    """The trace of `seed` and this shape; `declared` is the share of its requests that declare a hold, each
    declared hold up to `slack` longer than the true one."""
    rng = random.Random(seed)
    declaring = random.Random(f"{seed}:declared")
    fleet = whole_free_fleet(nodes)
    weights = dict(Counter(gpu.model for gpu in fleet.gpus))
    stretch = hold_stretch(gpus=len(fleet.gpus), horizon=horizon, requests=requests, load=load)
    timed: list[TimedRequest] = []
    at = 0.0
    while True:
        at += rng.expovariate(requests / horizon)
        if at >= horizon:
            break
        drawn = random_request(rng, f"r{len(timed) + 1:04d}", weights)
        hold = stretch * HOLD_MIN * (HOLD_MAX / HOLD_MIN) ** rng.random()
        items = tuple(Item(i.model, i.profile, i.count) for i in drawn.items)
        declared_hold = None
        if declaring.random() < declared:
            declared_hold = round(hold * (1 + slack * declaring.random()))
        timed.append(TimedRequest(drawn.id, int(at), round(hold), items, declared_hold=declared_hold))
    return SimulationTrace(fleet, tuple(timed), horizon, backfill_grace_seconds)


def request_slices(request: TimedRequest) -> int:
    return sum(item.count * profile_compute_slices(item.model, item.profile) for item in request.items)


def offered_load(trace: SimulationTrace) -> float:
    """Compute slices × hold asked for, over the fleet's compute slices × the horizon."""
    asked = sum(request_slices(r) * r.hold for r in trace.requests)
    return asked / (len(trace.fleet.gpus) * mig.COMPUTE_SLICES * trace.horizon)
