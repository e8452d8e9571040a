"""The NVML collector without a GPU: on this machine the real pynvml finds no driver and the collector
says so in one line; against a stand-in driver it reads every figure, and a MIG handle that answers
NotSupported (utilisation, power, temperature, ECC) costs only that field."""

from datetime import UTC, datetime
from types import SimpleNamespace

import pynvml
import pytest

from monitoring.collectors import CollectorUnavailable
from monitoring.collectors.nvml import NO_NVML, NvmlCollector

MOMENT = datetime(2026, 12, 1, 3, tzinfo=UTC)


def test_without_an_nvidia_driver_the_collector_says_so_in_one_line():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # a machine with a GPU: this test is about the others
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(CollectorUnavailable) as refused:
        NvmlCollector()
    assert str(refused.value) == NO_NVML and "\n" not in NO_NVML


class FakeNvml:
    """The part of pynvml the collector uses, over a described host: two H200s, the second cut into a
    3g.71gb and a 1g.18gb, on which MIG handles refuse what real ones refuse."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_GPM_METRICS_GET_VERSION = 1
    NVML_GPM_METRIC_SM_UTIL = 2
    nvmlEventTypeXidCriticalError = 8

    def __init__(self, *, gpm: bool = True):
        self.gpm = gpm
        self.busy = {("GPU-0", None): 0.0, ("GPU-1", None): 0.0, ("GPU-1", 1): 0.0, ("GPU-1", 2): 0.0}
        self.events = [SimpleNamespace(device="h0", eventData=79)]
        self.calls: list[str] = []
        self.shut = False

    def not_supported(self):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    # the driver
    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"h{index}"

    def nvmlDeviceGetUUID(self, handle):
        return {"h0": "GPU-0", "h1": "GPU-1", "m1": "MIG-1", "m2": "MIG-2"}[handle]

    def nvmlDeviceGetName(self, handle):
        return {"m1": "NVIDIA H200 MIG 3g.71gb", "m2": "NVIDIA H200 MIG 1g.18gb"}.get(handle, b"NVIDIA H200")

    def nvmlDeviceGetMigMode(self, handle):
        return [1, 1] if handle == "h1" else [0, 0]

    def _physical(self, handle):
        if handle.startswith("m"):
            self.not_supported()

    def nvmlDeviceGetPowerUsage(self, handle):
        self._physical(handle)
        return 412_345 if handle == "h0" else 98_000

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._physical(handle)
        return 71 if handle == "h0" else 44

    def nvmlDeviceGetUtilizationRates(self, handle):
        if handle == "h1":
            self.not_supported()  # MIG on: no utilisation for the whole GPU
        self._physical(handle)
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        used = {"h0": 60 << 30, "h1": 20 << 30, "m1": 15 << 30, "m2": 1 << 30}[handle]
        total = {"m1": 71 << 30, "m2": 18 << 30}.get(handle, 141 << 30)
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetTotalEccErrors(self, handle, kind, counter):
        self._physical(handle)
        return {("h0", 0): 3, ("h0", 1): 0, ("h1", 0): 0, ("h1", 1): 1}[(handle, kind)]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        if handle == "h1" and index in (0, 1):
            return f"m{index + 1}"
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetGpuInstanceId(self, mig):
        return {"m1": 1, "m2": 2}[mig]

    def nvmlDeviceGetGpuInstanceById(self, handle, instance_id):
        return f"gi{instance_id}"

    def nvmlGpuInstanceGetInfo(self, gpu_instance):
        start, size = {"gi1": (0, 4), "gi2": (6, 1)}[gpu_instance]
        return SimpleNamespace(placement=SimpleNamespace(start=start, size=size))

    # GPM: a sample is the GPU's busy time so far; the metric is its growth
    def nvmlGpmQueryDeviceSupport(self, handle):
        return SimpleNamespace(isSupportedDevice=int(self.gpm))

    def nvmlGpmSampleAlloc(self):
        return SimpleNamespace(value=None)

    def nvmlGpmSampleGet(self, handle, sample):
        sample.value = self.busy[(self.nvmlDeviceGetUUID(handle), None)]
        return sample

    def nvmlGpmMigSampleGet(self, handle, instance_id, sample):
        sample.value = self.busy[(self.nvmlDeviceGetUUID(handle), instance_id)]
        return sample

    def nvmlGpmSampleFree(self, sample):
        self.calls.append("free")

    def c_nvmlGpmMetricsGet_t(self):
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=None, value=None)])

    def nvmlGpmMetricsGet(self, query):
        assert query.metrics[0].metricId == self.NVML_GPM_METRIC_SM_UTIL
        query.metrics[0].value = query.sample2.value - query.sample1.value
        return query

    # XID events
    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, handle, kinds, events):
        self.calls.append(f"watch {handle}")

    def nvmlEventSetWait_v2(self, events, timeout):
        assert timeout == 0  # a reading never waits
        if not self.events:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, events):
        self.calls.append("free events")


def collector(fake: FakeNvml) -> NvmlCollector:
    return NvmlCollector(nvml=fake, host="h200-serve-1", clock=lambda: MOMENT)


def test_a_gpu_reads_in_the_contracts_units():
    fake = FakeNvml()
    reading = collector(fake).read()
    assert (reading.host, reading.at, len(reading.gpus)) == ("h200-serve-1", MOMENT, 2)
    whole = reading.gpus[0]
    assert (whole.uuid, whole.model, whole.mig_enabled) == ("GPU-0", "NVIDIA H200", False)
    assert whole.power_w == pytest.approx(412.345) and whole.temperature_c == 71
    assert whole.utilisation_pct == 87 and whole.memory_used_bytes == 60 << 30
    assert (whole.ecc_corrected, whole.ecc_uncorrected) == (3, 0)
    assert whole.xid_events == (79,) and whole.instances == () and whole.problems == ()


def test_mig_handles_that_refuse_a_figure_cost_only_that_figure():
    reading = collector(FakeNvml()).read()
    cut = reading.gpus[1]
    assert cut.mig_enabled is True and cut.utilisation_pct is None
    assert cut.problems == ("utilisation: not supported",)
    assert cut.power_w == 98 and cut.ecc_uncorrected == 1  # the physical GPU still reports them
    first, second = cut.instances
    assert (first.uuid, first.gpu_instance_id, first.profile, first.placement) == (
        "MIG-1",
        1,
        "3g.71gb",
        (0, 4),
    )
    assert (second.profile, second.placement, second.memory_total_bytes) == ("1g.18gb", (6, 1), 18 << 30)
    assert first.memory_used_bytes == 15 << 30 and first.problems == ()


def test_sm_activity_is_the_share_between_two_readings_per_gpu_and_per_instance():
    fake = FakeNvml()
    nvml = collector(fake)
    first = nvml.read()
    assert first.gpus[0].sm_active_pct is None and first.gpus[1].instances[0].sm_active_pct is None
    fake.busy.update({("GPU-0", None): 35.5, ("GPU-1", None): 12.0, ("GPU-1", 1): 80.0, ("GPU-1", 2): 0.0})
    second = nvml.read()
    assert second.gpus[0].sm_active_pct == 35.5 and second.gpus[1].sm_active_pct == 12.0
    assert [i.sm_active_pct for i in second.gpus[1].instances] == [80.0, 0.0]
    assert second.gpus[0].xid_events == ()  # an XID is reported once
    nvml.close()
    assert fake.shut and "free events" in fake.calls
    assert fake.calls.count("free") == 2 * 4  # the first samples, then the last ones at close


def test_a_gpu_before_hopper_has_no_sm_activity_and_says_why():
    reading = collector(FakeNvml(gpm=False)).read()
    assert reading.gpus[0].sm_active_pct is None
    assert reading.gpus[0].problems == ("SM activity: GPM needs a Hopper or newer GPU",)


def test_a_driver_that_fails_to_start_is_one_clear_line():
    fake = FakeNvml()

    def broken():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    fake.nvmlInit = broken
    with pytest.raises(CollectorUnavailable, match=r"^NVML did not start: Driver Not Loaded"):
        collector(fake)
