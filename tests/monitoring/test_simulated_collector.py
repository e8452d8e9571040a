"""The simulated collector: it honours the collector contract, the same inputs give the same readings, held
slots work while unheld ones idle, about one pool in twelve runs hot, counters never go down, and an
uncorrected ECC error comes exactly when its hash says, with XID 48 once."""

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from monitoring.collectors import (
    GpuReading,
    InstanceReading,
    Reading,
    SimulatedCollector,
    SimulatedGpu,
    SimulatedHost,
    SimulatedInstance,
)
from monitoring.collectors.simulated import (
    UTILISATION_NOT_SUPPORTED,
    WHOLE_GPU,
    XID_DOUBLE_BIT_ECC,
    Character,
    character_of,
)
from pools.mig import GPU_MODELS, place_profiles
from tests.examples import examples
from tests.monitoring.contract import assert_honours_contract
from tests.monitoring.test_nvml_collector import FakeNvml
from tests.monitoring.test_nvml_collector import collector as nvml_collector

MOMENT = datetime(2026, 12, 1, 14, 30, tzinfo=UTC)
POOLS = [f"pool-{n}" for n in range(1, 121)]
GiB = 1 << 30


class Clock:
    def __init__(self, at: datetime = MOMENT):
        self.at = at

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at += timedelta(**delta)


def pool(character: Character, nth: int = 0, seed: int = 0) -> str:
    return [key for key in POOLS if character_of(seed, key) is character][nth]


def mig(index: int, uuid: str, *instances: tuple[str, int], model: str = "H200-141GB") -> SimulatedGpu:
    return SimulatedGpu(
        index,
        uuid,
        model,
        mig_enabled=True,
        instances=tuple(
            SimulatedInstance(profile, start, f"MIG-{uuid}-{start}") for profile, start in instances
        ),
    )


# Like the demo's h200-serve nodes; GPUs and instances given out of order on purpose.
SERVE = SimulatedHost(
    "h200-serve-1",
    (
        mig(2, "s2", ("1g.18gb", 6), ("4g.71gb", 0), ("2g.35gb", 4)),
        SimulatedGpu(0, "s0", "H200-141GB"),
        mig(1, "s1", ("3g.71gb", 4), ("3g.71gb", 0)),
    ),
)
DEV = SimulatedHost(
    "h100-dev-1",
    (
        mig(0, "d0", *[("1g.10gb", start) for start in range(7)], model="H100-80GB"),
        SimulatedGpu(1, "d1", "H100-80GB"),
    ),
)


def simulated(hosts=(SERVE, DEV), busy=None, clock=None, **options) -> SimulatedCollector:
    return SimulatedCollector(hosts=hosts, busy=busy or {}, clock=clock or Clock(), **options)


def whole_gpus(count: int) -> SimulatedHost:
    return SimulatedHost("h100-train-1", tuple(SimulatedGpu(i, f"t{i}", "H100-80GB") for i in range(count)))


def gpu(reading: tuple[Reading, ...], uuid: str) -> GpuReading:
    return next(g for r in reading for g in r.gpus if g.uuid == uuid)


def instance(reading: tuple[Reading, ...], uuid: str) -> InstanceReading:
    return next(i for r in reading for g in r.gpus for i in g.instances if i.uuid == uuid)


def day_of_readings(collector: SimulatedCollector, clock: Clock, step_minutes: int = 17):
    for _ in range(24 * 60 // step_minutes):
        yield collector.readings()
        clock.advance(minutes=step_minutes)


# --- the contract ----------------------------------------------------------------------------------------


def test_the_simulated_collector_honours_the_contract():
    busy = {("s0", WHOLE_GPU): pool(Character.HOT), ("s1", 0): pool(Character.BUSY), ("d0", 3): "pool-9"}
    readings = assert_honours_contract(simulated(busy=busy))
    assert [r.host for r in readings] == ["h200-serve-1", "h100-dev-1"]


def test_the_nvml_collector_honours_the_contract_too():
    assert_honours_contract(nvml_collector(FakeNvml()))


class Broken:
    name = "broken"

    def __init__(self, gpu: GpuReading):
        self.gpu = gpu

    def readings(self):
        return (Reading("h", MOMENT, (self.gpu,)),)

    def close(self):
        pass


GOOD = GpuReading(0, "GPU-0", model="NVIDIA H200", memory_used_bytes=GiB, memory_total_bytes=141 * GiB)


@pytest.mark.parametrize(
    "broken",
    [
        replace(GOOD, memory_used_bytes=142 * GiB),
        replace(GOOD, utilisation_pct=101.0),
        replace(GOOD, sm_active_pct=-1.0),
        replace(GOOD, temperature_c=400.0),
        replace(GOOD, ecc_uncorrected=-1),
        replace(GOOD, uuid=""),
        replace(GOOD, mig_enabled=True, instances=(InstanceReading("MIG-a", 1, "3g.71gb", (2, 4)),)),
        replace(GOOD, mig_enabled=True, instances=(InstanceReading("MIG-a", 1, "3g.71gb", (0, 2)),)),
        replace(
            GOOD,
            mig_enabled=True,
            instances=(
                InstanceReading("MIG-a", 1, "4g.71gb", (0, 4)),
                InstanceReading("MIG-b", 2, "2g.35gb", (2, 2)),
            ),
        ),
        replace(GOOD, mig_enabled=False, instances=(InstanceReading("MIG-a", 0, "7g.141gb", (0, 8)),)),
    ],
    ids=[
        "memory over total",
        "utilisation over 100",
        "negative SM activity",
        "implausible temperature",
        "negative counter",
        "no uuid and no reason",
        "3g cannot start at 2",
        "3g takes 4 slices",
        "overlap",
        "instances with MIG off",
    ],
)
def test_the_contract_check_refuses_a_reading_that_breaks_it(broken):
    assert_honours_contract(Broken(GOOD))
    with pytest.raises(AssertionError):
        assert_honours_contract(Broken(broken))


@pytest.mark.parametrize("model", list(GPU_MODELS))
def test_every_catalogue_model_and_profile_can_be_simulated(model):
    gpus = [SimulatedGpu(0, f"{model}-whole", model)]
    for profile in GPU_MODELS[model].profiles.values():
        layout = place_profiles(GPU_MODELS[model], {profile.name: profile.max_count})
        instances = tuple(
            SimulatedInstance(i.profile, i.start, f"{model}-{len(gpus)}-{i.start}") for i in layout
        )
        gpus.append(SimulatedGpu(len(gpus), f"{model}-{len(gpus)}", model, True, instances))
    busy = {(g.uuid, i.start): "pool-3" for g in gpus for i in g.instances} | {
        (gpus[0].uuid, WHOLE_GPU): "pool-3"
    }
    readings = assert_honours_contract(simulated(hosts=(SimulatedHost("n", tuple(gpus)),), busy=busy))
    for reading in readings[0].gpus[1:]:
        assert sum(i.memory_total_bytes for i in reading.instances) <= reading.memory_total_bytes
        assert reading.memory_used_bytes == sum(i.memory_used_bytes for i in reading.instances)


def test_a_gpu_outside_the_mig_catalogue_is_simulated_whole_and_never_with_mig():
    whole = SimulatedGpu(0, "l40s-0", "L40S-48GB")
    readings = assert_honours_contract(
        simulated(hosts=(SimulatedHost("n", (whole,)),), busy={("l40s-0", WHOLE_GPU): "pool-1"})
    )
    assert readings[0].gpus[0].memory_total_bytes == 46_068 << 20
    assert readings[0].gpus[0].instances == ()
    with pytest.raises(ValueError, match="L40S-48GB has no MIG geometry"):
        simulated(hosts=(SimulatedHost("n", (SimulatedGpu(0, "l40s-1", "L40S-48GB", True),)),))


@settings(max_examples=examples(60), deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32),
    at=st.datetimes(min_value=datetime(2024, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)),
)
def test_any_moment_and_seed_honour_the_contract_and_the_characters(seed, at):
    keys = ["pool-1", "pool-2", "pool-3", "pool-4", "pool-5", "pool-6"]
    slots = [("s0", WHOLE_GPU), ("s1", 0), ("s1", 4), ("s2", 0), ("s2", 4), ("s2", 6)]
    busy = dict(zip(slots, keys, strict=True))
    readings = assert_honours_contract(simulated(busy=busy, clock=lambda: at, seed=seed))
    for (uuid, slot), key in busy.items():
        figure = gpu(readings, uuid) if slot == WHOLE_GPU else instance(readings, f"MIG-{uuid}-{slot}")
        low, high = {Character.BUSY: (40, 95), Character.IDLE: (0, 5), Character.HOT: (85, 100)}[
            character_of(seed, key)
        ]
        assert low <= figure.sm_active_pct <= high


# --- what it reads ---------------------------------------------------------------------------------------


def test_one_reading_per_host_gpus_by_index_instances_by_start():
    readings = simulated().readings()
    serve, dev = readings
    assert (serve.host, serve.at, dev.at) == ("h200-serve-1", MOMENT, MOMENT)
    assert [g.index for g in serve.gpus] == [0, 1, 2] and [g.uuid for g in serve.gpus] == ["s0", "s1", "s2"]
    whole, halves, mixed = serve.gpus
    assert (whole.model, whole.mig_enabled, whole.memory_total_bytes) == ("NVIDIA H200", False, 143_771 << 20)
    assert [(i.profile, i.placement, i.gpu_instance_id) for i in mixed.instances] == [
        ("4g.71gb", (0, 4), 1),
        ("2g.35gb", (4, 2), 5),
        ("1g.18gb", (6, 1), 13),
    ]
    assert [i.placement for i in halves.instances] == [(0, 4), (4, 4)]
    assert mixed.instances[2].memory_total_bytes == 16 * GiB  # the captured H200 1g figure
    assert dev.gpus[0].model == "NVIDIA H100 80GB HBM3" and len(dev.gpus[0].instances) == 7
    assert dev.gpus[0].instances[0].memory_total_bytes == int(9.75 * GiB)


def test_same_inputs_and_clock_give_the_same_readings():
    busy = {("s0", WHOLE_GPU): "pool-1", ("s1", 4): "pool-2", ("d0", 0): "pool-3"}
    first, second = simulated(busy=busy).readings(), simulated(busy=dict(busy)).readings()
    assert first == second
    assert simulated(busy=busy, seed=1).readings() != first


def test_a_held_busy_slot_works_and_an_unheld_one_idles():
    busy_pool, idle_pool = pool(Character.BUSY), pool(Character.IDLE)
    busy = {("s1", 0): busy_pool, ("s2", 4): idle_pool, ("s0", WHOLE_GPU): busy_pool}
    clock = Clock()
    collector = simulated(busy=busy, clock=clock)
    for readings in day_of_readings(collector, clock):
        working, resting, billed_idle = (
            instance(readings, uuid) for uuid in ("MIG-s1-0", "MIG-s1-4", "MIG-s2-4")
        )
        assert 40 <= working.sm_active_pct <= 95
        share = working.memory_used_bytes / working.memory_total_bytes
        assert (
            0.8 * working.sm_active_pct / 100 <= share <= 0.95 * working.sm_active_pct / 100
        )  # follows activity
        assert resting.sm_active_pct < 0.5 and resting.memory_used_bytes < 0.01 * resting.memory_total_bytes
        assert (
            billed_idle.sm_active_pct < 5
            and billed_idle.memory_used_bytes < 0.05 * billed_idle.memory_total_bytes
        )
        held, unheld = gpu(readings, "s0"), gpu(readings, "d1")
        assert held.utilisation_pct >= 40 and held.power_w > 300 and 45 <= held.temperature_c <= 80
        assert unheld.sm_active_pct < 0.5 and unheld.power_w < 80 and unheld.temperature_c < 40


def test_a_mig_gpu_has_no_utilisation_and_its_power_follows_its_instances():
    busy_pool = pool(Character.BUSY)
    busy = {("s1", 0): busy_pool, ("s1", 4): busy_pool}
    readings = simulated(busy=busy).readings()
    working, resting = gpu(readings, "s1"), gpu(readings, "s2")
    for cut in (working, resting):
        assert cut.utilisation_pct is None and cut.problems == (UTILISATION_NOT_SUPPORTED,)
    halves = [i.sm_active_pct for i in working.instances]
    assert working.sm_active_pct == pytest.approx(sum(a * 3 for a in halves) / 7, abs=0.01)  # 3g: 3 of 7
    assert working.power_w > resting.power_w + 150 and working.temperature_c > resting.temperature_c + 10
    assert working.memory_used_bytes == sum(i.memory_used_bytes for i in working.instances)


def test_figures_move_smoothly_yet_vary_over_a_day():
    key = pool(Character.BUSY)
    clock = Clock()
    collector = simulated(busy={("s0", WHOLE_GPU): key}, clock=clock)
    figures = []
    for _ in range(24 * 60 // 5):
        figures.append(gpu(collector.readings(), "s0").sm_active_pct)
        clock.advance(minutes=5)
    assert max(abs(b - a) for a, b in pairwise(figures)) <= 8
    assert max(figures) - min(figures) >= 10


def test_about_one_pool_in_twelve_runs_hot_and_its_gpu_reads_above_85():
    characters = [character_of(0, key) for key in POOLS]
    assert 4 <= characters.count(Character.HOT) <= 18
    assert 8 <= characters.count(Character.IDLE) <= 35
    assert characters.count(Character.BUSY) > len(POOLS) / 2
    hot, cool = pool(Character.HOT), pool(Character.BUSY)
    busy = {("s0", WHOLE_GPU): hot, ("s2", 6): hot, ("d1", WHOLE_GPU): cool}
    clock = Clock()
    collector = simulated(busy=busy, clock=clock)
    for readings in day_of_readings(collector, clock):
        for uuid in ("s0", "s2"):  # a hot pool on a 1g instance heats its whole GPU too
            heated = gpu(readings, uuid)
            assert heated.temperature_c > 85 and 0.9 * 700 <= heated.power_w <= 700
        assert gpu(readings, "d1").temperature_c < 80  # busy is not hot
        assert gpu(readings, "s0").sm_active_pct >= 88


# --- counters ----------------------------------------------------------------------------------------------


def test_counters_never_decrease_over_simulated_hours():
    clock = Clock()
    collector = simulated(hosts=(SERVE, DEV, whole_gpus(24)), clock=clock, ecc_one_in=50)
    first = {g.uuid: g for r in collector.readings() for g in r.gpus}
    previous = first
    for hour in range(72):
        clock.advance(hours=-3 if hour == 40 else 1)  # once, the clock steps back
        now = {g.uuid: g for r in collector.readings() for g in r.gpus}
        for uuid, reading in now.items():
            assert reading.ecc_corrected >= previous[uuid].ecc_corrected
            assert reading.ecc_uncorrected >= previous[uuid].ecc_uncorrected
        previous = now
    grew = [uuid for uuid in first if previous[uuid].ecc_corrected > first[uuid].ecc_corrected]
    assert grew and len(grew) < len(first)  # slowly: some GPUs, not all


def test_an_uncorrected_ecc_error_when_the_hash_hits_reports_xid_48_once():
    clock = Clock()
    collector = simulated(hosts=(DEV,), clock=clock, ecc_one_in=1)  # every minute hits
    first = gpu(collector.readings(), "d1")
    assert (first.ecc_uncorrected, first.xid_events) == (1, (XID_DOUBLE_BIT_ECC,))
    clock.advance(seconds=30)
    again = gpu(collector.readings(), "d1")  # the same minute: counted already
    assert (again.ecc_uncorrected, again.xid_events) == (1, ())
    clock.advance(minutes=1)
    later = gpu(collector.readings(), "d1")
    assert (later.ecc_uncorrected, later.xid_events) == (2, (XID_DOUBLE_BIT_ECC,))


def test_the_uncorrected_ecc_rule_is_the_hash_of_seed_gpu_and_minute():
    clock = Clock()
    collector = simulated(hosts=(SERVE,), clock=clock, ecc_one_in=40, seed=7)
    seen: dict[str, list[int]] = {"s0": [], "s1": [], "s2": []}
    minutes = range(int(MOMENT.timestamp() // 60), int(MOMENT.timestamp() // 60) + 400)
    for minute in minutes:
        for reading in collector.readings()[0].gpus:
            if reading.xid_events:
                assert reading.xid_events == (XID_DOUBLE_BIT_ECC,)
                seen[reading.uuid].append(minute)
        clock.advance(minutes=1)
    expected = {uuid: [m for m in minutes if collector.uncorrected_ecc_in(uuid, m)] for uuid in seen}
    assert seen == expected and sum(map(len, seen.values())) >= 10  # about 3 × 400 / 40
    assert [g.ecc_uncorrected for g in collector.readings()[0].gpus] == [
        len(seen[u]) for u in ("s0", "s1", "s2")
    ]
    default = simulated(hosts=(SERVE,))
    assert sum(default.uncorrected_ecc_in("s0", m) for m in minutes) == 0  # rare by default


# --- a fleet that cannot exist ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gpus",
    [
        (SimulatedGpu(0, "x", "Z100-1GB"),),
        (mig(0, "x", ("3g.71gb", 2)),),
        (mig(0, "x", ("4g.71gb", 0), ("2g.35gb", 2)),),
        (SimulatedGpu(0, "x", "H200-141GB", instances=(SimulatedInstance("7g.141gb", 0, "m"),)),),
        (SimulatedGpu(0, "x", "H200-141GB"), SimulatedGpu(1, "x", "H200-141GB")),
        (SimulatedGpu(0, "x", "H200-141GB"), SimulatedGpu(0, "y", "H200-141GB")),
    ],
    ids=["unknown model", "bad start", "overlap", "instances with MIG off", "uuid twice", "index twice"],
)
def test_a_fleet_no_real_one_could_be_is_refused(gpus):
    with pytest.raises(ValueError):
        SimulatedCollector(hosts=(SimulatedHost("n", gpus),))
