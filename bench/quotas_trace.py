"""Seeded time traces for bench/quotas.py: tenants whose guarantees cover the fleet, each asking in bursts.

Words used here (the simulator's are pools/placement/simulation.py's, the policy's
pools/placement/admission.py's):
- fleet: bench/simulate_trace.py's, 8 nodes × 8 whole free GPUs, half H100 and half H200.
- guarantees: each of `tenants` tenants is guaranteed an equal share of each model's compute slices (the
  remainder to the first tenants), so that together they cover the fleet.
- bursts: a tenant alternates quiet spells (exponential, mean `quiet_mean`, QUIET_MEAN by default) and busy
  spells (uniform from BUSY_MIN to BUSY_MAX). In a busy spell its requests arrive as a Poisson process at a
  rate that, with the holds, asks for its burst load times its guarantee; in a quiet spell none arrive. The
  tenants' spells are drawn apart, so that some tenants are busy while others are quiet.
- burst loads: spread evenly around BURST_LOAD by `spread` (BURST_SPREAD by default) either way, the first
  tenant the lightest: with the defaults 1 to 4 times the guarantee. Busy 15 hours in 37.5 on average, the
  tenants ask on average for 0.4 to 1.6 times their guarantees, and together for the whole fleet: some teams'
  guarantees sit idle while others need more than theirs, the case borrowing is for. With `spread` 0, every
  tenant asks on average for its guarantee and strict quotas lose little: none at all served only 1.15 times
  as much as strict quotas on the five seeded weeks, and no policy that lends idle capacity could do more;
  with quiet spells of 36 hours too (three quarters subscribed), 1.14 times.
- items and holds: items as bench/placement.py draws them, the model in proportion to the fleet's GPUs of
  it; holds log-uniform from HOLD_MIN to HOLD_MAX.

Everything is a function of the seed and the shape: the same seed gives the same trace.
"""

from __future__ import annotations

import math
import random
from collections import Counter

from bench.placement_trace import random_request
from bench.simulate_trace import HOUR, NODES, WEEK, expected_request_slices, whole_free_fleet
from pools import mig
from pools.placement.admission import Quota
from pools.placement.simulation import SimulationTrace, TimedRequest
from pools.placement.types import Item

TENANTS = 4
RECLAIM_NOTICE = 900  # the portal's default RECLAIM_NOTICE_SECONDS
BACKFILL_GRACE_SECONDS = 1800  # the portal's default QUEUE_BACKFILL_GRACE_SECONDS
QUIET_MEAN = 22.5 * HOUR
BUSY_MIN, BUSY_MAX = 6 * HOUR, 24 * HOUR
HOLD_MIN, HOLD_MAX = HOUR, 24 * HOUR
BURST_LOAD = 2.5
BURST_SPREAD = 1.5


def guarantees(fleet, tenants: int) -> dict[str, dict[tuple[str, str], Quota]]:
    """Per tenant, an equal share of each model's compute slices, in whole GPUs where they divide."""
    slices = Counter()
    for gpu in fleet.gpus:
        slices[gpu.model] += mig.COMPUTE_SLICES
    names = [f"tenant-{n + 1}" for n in range(tenants)]
    found: dict[str, dict[tuple[str, str], Quota]] = {name: {} for name in names}
    for model, total in slices.items():
        share, rest = divmod(total, tenants)
        for n, name in enumerate(names):
            guaranteed = share + (1 if n < rest else 0)
            found[name][("", model)] = Quota(guaranteed, guaranteed)
    return found


def burst_load(number: int, tenants: int, spread: float = BURST_SPREAD) -> float:
    """How many times its guarantee tenant `number` (from 0) asks for in a busy spell: spread evenly around
    BURST_LOAD by `spread` either way, the first tenant the lightest."""
    if tenants == 1:
        return BURST_LOAD
    return BURST_LOAD - spread + 2 * spread * number / (tenants - 1)


def bursty_trace(
    seed: int,
    *,
    tenants: int = TENANTS,
    nodes: int = NODES,
    horizon: int = WEEK,
    backfill_grace_seconds: int | None = BACKFILL_GRACE_SECONDS,
    spread: float = BURST_SPREAD,
    quiet_mean: float = QUIET_MEAN,
) -> SimulationTrace:
    rng = random.Random(seed)
    fleet = whole_free_fleet(nodes)
    weights = dict(Counter(gpu.model for gpu in fleet.gpus))
    quotas = guarantees(fleet, tenants)
    mean_hold = (HOLD_MAX - HOLD_MIN) / math.log(HOLD_MAX / HOLD_MIN)
    arrivals: list[tuple[int, str]] = []
    for number, (name, keys) in enumerate(quotas.items()):
        guaranteed = sum(quota.guaranteed for quota in keys.values())
        # Requests per second in a busy spell: its burst load × its guarantee, in slices held at once.
        rate = burst_load(number, tenants, spread) * guaranteed / (expected_request_slices() * mean_hold)
        at = rng.expovariate(1 / quiet_mean) * rng.random()  # some tenants start busy, some quiet
        while at < horizon:
            busy_until = at + rng.uniform(BUSY_MIN, BUSY_MAX)
            while True:
                at += rng.expovariate(rate)
                if at >= min(busy_until, horizon):
                    break
                arrivals.append((int(at), name))
            at = busy_until + rng.expovariate(1 / quiet_mean)
    arrivals.sort()
    timed = []
    for n, (at, tenant) in enumerate(arrivals):
        drawn = random_request(rng, f"r{n + 1:04d}", weights)
        hold = round(HOLD_MIN * (HOLD_MAX / HOLD_MIN) ** rng.random())
        items = tuple(Item(i.model, i.profile, i.count) for i in drawn.items)
        timed.append(TimedRequest(drawn.id, at, hold, items, tenant=tenant))
    return SimulationTrace(
        fleet,
        tuple(timed),
        horizon,
        backfill_grace_seconds,
        quotas=quotas,
        reclaim_notice_seconds=RECLAIM_NOTICE,
    )
