"""The DCGM collector against a real Prometheus scraping two stand-in dcgm-exporters (an H100 host cut
into a 3g.40gb and a 1g.10gb, each held by a pod, and an H200 host used whole). Answers no Prometheus
should give: test_dcgm_answers.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from monitoring.collectors import DcgmPrometheusCollector
from tests.monitoring.contract import assert_honours_contract
from tests.monitoring.dcgm_exporter import DcgmExporter, Device, exposition, running_prometheus

# The stand-in Prometheus servers listen on loopback, which the collector reads only when allowed.
pytestmark = pytest.mark.usefixtures("private_networks_allowed")

MIB = 1 << 20
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
CUT_GPU, WHOLE_GPU = "GPU-5d1f3c2e-8a4b-4f0e-9c61-2b7d0a9e4f13", "GPU-a07b9e11-3c5d-4e2f-8b90-6f1d2c3e4a57"

MIG_GPU = Device(
    0,
    CUT_GPU,
    H100,
    {
        "DCGM_FI_DEV_SM_CLOCK": 1980,
        "DCGM_FI_DEV_GPU_TEMP": 61,
        "DCGM_FI_DEV_POWER_USAGE": 312.5,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": 2,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0,
        "DCGM_FI_DEV_XID_ERRORS": 0,
    },
)
BIG_SLICE = Device(
    0,
    CUT_GPU,
    H100,
    {
        "DCGM_FI_DEV_FB_USED": 30720,
        "DCGM_FI_DEV_FB_FREE": 9728,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.7112,
        "DCGM_FI_PROF_SM_ACTIVE": 0.625,
    },
    mig=("3g.40gb", 1),
    pod=("team-a", "bert-train-0", "trainer"),
)
SMALL_SLICE = Device(
    0,
    CUT_GPU,
    H100,
    {"DCGM_FI_DEV_FB_USED": 512, "DCGM_FI_DEV_FB_FREE": 9472, "DCGM_FI_PROF_SM_ACTIVE": 0.05},
    mig=("1g.10gb", 13),
    pod=("team-b", "notebook-7f9c", "jupyter"),
)
WHOLE = Device(
    0,
    WHOLE_GPU,
    H200,
    {
        "DCGM_FI_DEV_SM_CLOCK": 1755,
        "DCGM_FI_DEV_GPU_TEMP": 72,
        "DCGM_FI_DEV_POWER_USAGE": 612.75,
        "DCGM_FI_DEV_GPU_UTIL": 87,
        "DCGM_FI_DEV_FB_FREE": 45056,
        "DCGM_FI_DEV_FB_USED": 98304,
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": 5,  # only the aggregate counters are exported here
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": 1,
        "DCGM_FI_DEV_XID_ERRORS": 79,
        "DCGM_FI_PROF_SM_ACTIVE": 0.4231,
    },
    pod=("team-c", "vllm-0", "server"),
    pci_bus_id="00000000:9A:00.0",
)
HOSTS = {
    "dgx-h100-a": exposition("dgx-h100-a", [MIG_GPU, BIG_SLICE, SMALL_SLICE]),
    "h200-serve-b": exposition("h200-serve-b", [WHOLE]),
}


@pytest.fixture(scope="module")
def exporters():
    started = {host: DcgmExporter(text).start() for host, text in HOSTS.items()}
    yield started
    for exporter in started.values():
        exporter.stop()


@pytest.fixture(scope="module")
def prometheus(exporters, tmp_path_factory):
    with running_prometheus(list(exporters.values()), tmp_path_factory.mktemp("prometheus")) as url:
        yield url


@pytest.fixture
def cluster(exporters, prometheus):
    """The hosts as described above, as Prometheus holds them (put back if a test changed them)."""
    for host, exporter in exporters.items():
        if exporter.text != HOSTS[host]:
            exporter.serve(HOSTS[host])
            exporter.wait_served()
    return exporters


@pytest.fixture
def dcgm(prometheus):
    collector = DcgmPrometheusCollector(prometheus)
    yield collector
    collector.close()


def by_host(readings):
    return {reading.host: reading for reading in readings}


def change(exporter: DcgmExporter, host: str, devices: list[Device]) -> None:
    exporter.serve(exposition(host, devices))
    exporter.wait_served()


# --- from a real Prometheus ------------------------------------------------------------------------------


def test_each_host_is_one_reading_stamped_with_its_newest_sample(cluster, dcgm):
    before = datetime.now(UTC)
    readings = dcgm.readings()
    assert dcgm.name == "dcgm"
    assert [reading.host for reading in readings] == ["dgx-h100-a", "h200-serve-b"]
    for reading in readings:
        assert reading.at.tzinfo is not None and reading.at.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=5) < reading.at <= datetime.now(UTC)  # scraped every second
        assert reading.problems == ()


def test_the_dcgm_collector_honours_the_contract(cluster, prometheus):
    readings = assert_honours_contract(DcgmPrometheusCollector(prometheus))
    assert sum(len(gpu.instances) for reading in readings for gpu in reading.gpus) == 2


def test_a_whole_gpu_reads_in_the_contracts_units(cluster, dcgm):
    (gpu,) = by_host(dcgm.readings())["h200-serve-b"].gpus
    assert (gpu.index, gpu.uuid, gpu.model, gpu.mig_enabled, gpu.instances) == (0, WHOLE_GPU, H200, None, ())
    assert (gpu.utilisation_pct, gpu.sm_active_pct) == (87, 42.31)
    assert (gpu.power_w, gpu.temperature_c) == (612.75, 72)
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (98304 * MIB, 143360 * MIB)  # 140 GiB
    assert (gpu.ecc_corrected, gpu.ecc_uncorrected) == (5, 1)  # from the aggregate counters
    assert gpu.xid_events == (79,) and gpu.problems == ()


def test_a_mig_gpu_reads_its_instances_and_its_own_figures_from_gpu_series(cluster, dcgm):
    (gpu,) = by_host(dcgm.readings())["dgx-h100-a"].gpus
    assert (gpu.index, gpu.uuid, gpu.model, gpu.mig_enabled) == (0, CUT_GPU, H100, True)
    assert (gpu.power_w, gpu.temperature_c, gpu.ecc_corrected, gpu.ecc_uncorrected) == (312.5, 61, 2, 0)
    assert gpu.xid_events == ()  # XID 0: none
    assert (gpu.utilisation_pct, gpu.sm_active_pct, gpu.memory_used_bytes, gpu.memory_total_bytes) == (
        None,
        None,
        None,
        None,
    )
    assert gpu.problems == (
        "utilisation: not exported (DCGM_FI_DEV_GPU_UTIL)",
        "SM activity: reported per MIG instance only",
        "memory used: reported per MIG instance only",
        "memory total: reported per MIG instance only",
    )
    big, small = gpu.instances
    assert (big.gpu_instance_id, big.profile, big.sm_active_pct) == (1, "3g.40gb", 62.5)
    assert (big.memory_used_bytes, big.memory_total_bytes) == (30 << 30, 40448 * MIB)  # 39.5 GiB usable
    assert (small.gpu_instance_id, small.profile, small.sm_active_pct) == (13, "1g.10gb", 5.0)
    assert (small.memory_used_bytes, small.memory_total_bytes) == (512 * MIB, 9984 * MIB)
    assert big.problems == small.problems == () and big.placement is None and big.uuid == ""


def test_an_instance_removed_by_a_layout_change_is_gone_after_the_next_scrape(cluster, dcgm):
    grown = replace(BIG_SLICE, fields={**BIG_SLICE.fields, "DCGM_FI_DEV_FB_USED": 40000})
    change(cluster["dgx-h100-a"], "dgx-h100-a", [MIG_GPU, grown])
    (gpu,) = by_host(dcgm.readings())["dgx-h100-a"].gpus
    assert [(i.gpu_instance_id, i.memory_used_bytes) for i in gpu.instances] == [(1, 40000 * MIB)]


def test_a_malformed_series_costs_only_itself(cluster, dcgm):
    broken = replace(WHOLE, fields={**WHOLE.fields, "DCGM_FI_DEV_POWER_USAGE": "NaN"})
    nameless = Device(1, "", H200, {"DCGM_FI_DEV_GPU_TEMP": 40}, pci_bus_id="00000000:AB:00.0")
    unnumbered = Device("", "GPU-0c9e", H200, {"DCGM_FI_DEV_GPU_TEMP": 41}, pci_bus_id="00000000:BB:00.0")
    change(cluster["h200-serve-b"], "h200-serve-b", [broken, nameless, unnumbered])
    reading = by_host(dcgm.readings())["h200-serve-b"]
    assert reading.problems == (
        "DCGM_FI_DEV_GPU_TEMP of gpu 1: no UUID label; skipped",
        "GPU GPU-0c9e: gpu label None, not an index; skipped",
    )
    (gpu,) = reading.gpus
    assert gpu.power_w is None and gpu.problems == ("power: DCGM_FI_DEV_POWER_USAGE is NaN; skipped",)
    assert (gpu.temperature_c, gpu.utilisation_pct, gpu.xid_events) == (72, 87, (79,))


def test_gpu_figures_dcgm_gives_only_per_instance_stay_unknown_for_the_gpu(cluster, dcgm):
    device_level = {k: v for k, v in MIG_GPU.fields.items() if k != "DCGM_FI_DEV_XID_ERRORS"}
    per_instance = [
        replace(BIG_SLICE, fields={**BIG_SLICE.fields, **device_level}),
        replace(SMALL_SLICE, fields={**SMALL_SLICE.fields, **device_level}),
    ]
    change(cluster["dgx-h100-a"], "dgx-h100-a", per_instance)
    (gpu,) = by_host(dcgm.readings())["dgx-h100-a"].gpus
    assert (gpu.index, gpu.model, gpu.mig_enabled) == (0, H100, True)
    assert (gpu.power_w, gpu.temperature_c, gpu.ecc_corrected) == (None, None, None)
    assert "power: reported per MIG instance only" in gpu.problems
    assert "XID: not exported (DCGM_FI_DEV_XID_ERRORS)" in gpu.problems
    assert [i.memory_used_bytes for i in gpu.instances] == [30720 * MIB, 512 * MIB]


def test_a_host_without_a_hostname_label_is_named_by_its_scrape_target(cluster, dcgm):
    change(cluster["h200-serve-b"], "", [WHOLE])
    assert sorted(by_host(dcgm.readings())) == ["127.0.0.1", "dgx-h100-a"]


def test_samples_older_than_the_staleness_bound_are_left_out(cluster, prometheus):
    def later(minutes: float):
        return lambda: datetime.now(UTC) + timedelta(minutes=minutes)

    assert DcgmPrometheusCollector(prometheus, clock=later(10)).readings() == ()
    lenient = DcgmPrometheusCollector(prometheus, clock=later(5), staleness=timedelta(minutes=6))
    assert len(lenient.readings()) == 2
    assert "[360s]" in lenient.query
