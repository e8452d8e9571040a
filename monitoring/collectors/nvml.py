"""The NVML collector: reads this host's GPUs and MIG instances through the NVIDIA driver (`pynvml`,
package nvidia-ml-py). It only reads: it never changes MIG mode, layout or any setting.

What NVML gives (NVIDIA's NVML API reference: device queries, MIG and GPM; `pynvml` keeps its names):
- per GPU: power (mW, shown in W), temperature, utilisation (NotSupported once MIG is on), memory,
  volatile corrected / uncorrected ECC counts, XID events (through an event set);
- per MIG instance: memory and its GPU instance's placement; power, temperature and ECC exist only
  for the physical GPU;
- SM activity through GPM (Hopper and newer), per GPU and per GPU instance, as the share of time
  between two samples: the first reading of each has none yet.
Any figure NVML refuses is left None with the reason in the reading's `problems`, so one field that
is not supported never costs the others.
"""

from __future__ import annotations

import re
import socket
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, datetime

from msgspec.structs import replace

from monitoring.collectors.base import CollectorUnavailable, GpuReading, InstanceReading, Reading

NO_NVML = (
    "NVML is not available on this machine: the NVIDIA driver's library (libnvidia-ml.so.1) was not found, "
    "so there is no GPU to read here."
)
MIG_NAME = re.compile(r"MIG\s+(\S+)\s*$")  # "NVIDIA H200 MIG 3g.71gb" → 3g.71gb
MAX_EVENTS_PER_READING = 1000


def load_pynvml():
    import pynvml  # the only import of pynvml in the project

    return pynvml


class _Fields:
    """Reads figures one by one, keeping the reason of each that NVML refuses."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.problems: list[str] = []

    def get(self, name: str, call: Callable, *args):
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported:
            self.problems.append(f"{name}: not supported")
        except self.nvml.NVMLError as error:
            self.problems.append(f"{name}: {error}")
        return None


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlCollector:
    name = "nvml"

    def __init__(self, *, nvml=None, host: str | None = None, clock: Callable[[], datetime] | None = None):
        try:
            self.nvml = nvml or load_pynvml()
        except ImportError as error:
            raise CollectorUnavailable("The nvidia-ml-py package (pynvml) is not installed.") from error
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError_LibraryNotFound as error:
            raise CollectorUnavailable(NO_NVML) from error
        except self.nvml.NVMLError as error:
            raise CollectorUnavailable(f"NVML did not start: {error}.") from error
        self.host = host or socket.gethostname()
        self._clock = clock or (lambda: datetime.now(UTC))
        self._gpm_samples: dict[tuple[str, int | None], object] = {}
        self._gpm_supported: dict[str, bool] = {}
        self._events = self._watch_xids()

    # --- a reading -------------------------------------------------------------------------------

    def readings(self) -> tuple[Reading, ...]:
        return (self.read(),)

    def read(self) -> Reading:
        """This host's GPUs."""
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            return Reading(self.host, self._clock(), (), (f"GPU count: {error}",))
        xids = self._drain_xids()
        return Reading(self.host, self._clock(), tuple(self._gpu(index, xids) for index in range(count)))

    def _gpu(self, index: int, xids: dict[str, list[int]]) -> GpuReading:
        nvml = self.nvml
        fields = _Fields(nvml)
        handle = fields.get("handle", nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return GpuReading(index, "", problems=tuple(fields.problems))
        uuid = _text(fields.get("uuid", nvml.nvmlDeviceGetUUID, handle) or "")
        name = fields.get("model", nvml.nvmlDeviceGetName, handle)
        modes = fields.get("MIG mode", nvml.nvmlDeviceGetMigMode, handle)
        mig_enabled = None if modes is None else modes[0] == nvml.NVML_DEVICE_MIG_ENABLE
        power_mw = fields.get("power", nvml.nvmlDeviceGetPowerUsage, handle)
        rates = fields.get("utilisation", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = fields.get("memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        reading = GpuReading(
            index=index,
            uuid=uuid,
            model=None if name is None else _text(name),
            mig_enabled=mig_enabled,
            power_w=None if power_mw is None else power_mw / 1000,
            temperature_c=fields.get(
                "temperature", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU
            ),
            utilisation_pct=None if rates is None else float(rates.gpu),
            sm_active_pct=self._sm_active(fields, handle, uuid, None),
            memory_used_bytes=None if memory is None else memory.used,
            memory_total_bytes=None if memory is None else memory.total,
            ecc_corrected=self._ecc(fields, handle, "ECC corrected", corrected=True),
            ecc_uncorrected=self._ecc(fields, handle, "ECC uncorrected", corrected=False),
            xid_events=tuple(xids.get(uuid, ())),
            instances=self._instances(fields, handle, uuid) if mig_enabled else (),
        )
        return _with_problems(reading, fields.problems)

    def _ecc(self, fields: _Fields, handle, name: str, *, corrected: bool) -> int | None:
        nvml = self.nvml
        kind = nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED if corrected else nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return fields.get(name, nvml.nvmlDeviceGetTotalEccErrors, handle, kind, nvml.NVML_VOLATILE_ECC)

    def _instances(self, gpu_fields: _Fields, handle, gpu_uuid: str) -> tuple[InstanceReading, ...]:
        nvml = self.nvml
        slots = gpu_fields.get("MIG instances", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        found = []
        for slot in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except nvml.NVMLError_NotFound:
                continue  # an empty slot
            except nvml.NVMLError as error:
                gpu_fields.problems.append(f"MIG instance {slot}: {error}")
                continue
            fields = _Fields(nvml)
            uuid = _text(fields.get("uuid", nvml.nvmlDeviceGetUUID, mig) or "")
            instance_id = fields.get("GPU instance", nvml.nvmlDeviceGetGpuInstanceId, mig)
            name = fields.get("profile", nvml.nvmlDeviceGetName, mig)
            profile = MIG_NAME.search(_text(name)) if name is not None else None
            memory = fields.get("memory", nvml.nvmlDeviceGetMemoryInfo, mig)
            instance = InstanceReading(
                uuid=uuid,
                gpu_instance_id=-1 if instance_id is None else instance_id,
                profile=profile[1] if profile else None,
                placement=None if instance_id is None else self._placement(fields, handle, instance_id),
                memory_used_bytes=None if memory is None else memory.used,
                memory_total_bytes=None if memory is None else memory.total,
                sm_active_pct=None
                if instance_id is None
                else self._sm_active(fields, handle, gpu_uuid, instance_id),
            )
            found.append(_with_problems(instance, fields.problems))
        return tuple(found)

    def _placement(self, fields: _Fields, handle, instance_id: int) -> tuple[int, int] | None:
        nvml = self.nvml
        gpu_instance = fields.get("placement", nvml.nvmlDeviceGetGpuInstanceById, handle, instance_id)
        info = (
            None
            if gpu_instance is None
            else fields.get("placement", nvml.nvmlGpuInstanceGetInfo, gpu_instance)
        )
        return None if info is None else (info.placement.start, info.placement.size)

    # --- SM activity through GPM -------------------------------------------------------------------

    def _sm_active(self, fields: _Fields, handle, gpu_uuid: str, instance_id: int | None) -> float | None:
        """The SM activity since the previous reading of this GPU (or GPU instance); None the first time."""
        nvml = self.nvml
        if gpu_uuid not in self._gpm_supported:
            support = fields.get("SM activity", nvml.nvmlGpmQueryDeviceSupport, handle)
            self._gpm_supported[gpu_uuid] = bool(support and support.isSupportedDevice)
            if support is not None and not support.isSupportedDevice:
                fields.problems.append("SM activity: GPM needs a Hopper or newer GPU")
        if not self._gpm_supported[gpu_uuid]:
            return None
        sample = fields.get("SM activity", nvml.nvmlGpmSampleAlloc)
        if sample is None:
            return None
        if instance_id is None:
            taken = fields.get("SM activity", nvml.nvmlGpmSampleGet, handle, sample)
        else:
            taken = fields.get("SM activity", nvml.nvmlGpmMigSampleGet, handle, instance_id, sample)
        key = (gpu_uuid, instance_id)
        previous = self._gpm_samples.pop(key, None)
        if taken is None:
            self._free(sample)
            return None
        self._gpm_samples[key] = sample
        if previous is None:
            return None
        query = nvml.c_nvmlGpmMetricsGet_t()
        query.version = nvml.NVML_GPM_METRICS_GET_VERSION
        query.numMetrics = 1
        query.sample1, query.sample2 = previous, sample
        query.metrics[0].metricId = nvml.NVML_GPM_METRIC_SM_UTIL
        answer = fields.get("SM activity", nvml.nvmlGpmMetricsGet, query)
        self._free(previous)
        return None if answer is None else round(float(answer.metrics[0].value), 2)

    def _free(self, sample) -> None:
        with suppress(self.nvml.NVMLError):  # the driver keeps nothing we could free
            self.nvml.nvmlGpmSampleFree(sample)

    # --- XID events --------------------------------------------------------------------------------

    def _watch_xids(self):
        """An event set registered for critical XIDs on every GPU that offers them (None: none does)."""
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError:
            return None
        watched = 0
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
                watched += 1
            except nvml.NVMLError:
                continue  # XID events not offered on this GPU
        return events if watched else None

    def _drain_xids(self) -> dict[str, list[int]]:
        """GPU UUID → the XIDs reported since the previous reading, without waiting."""
        nvml = self.nvml
        found: dict[str, list[int]] = defaultdict(list)
        if self._events is None:
            return found
        for _ in range(MAX_EVENTS_PER_READING):
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError_Timeout:
                break
            except nvml.NVMLError:
                break
            try:
                found[_text(nvml.nvmlDeviceGetUUID(event.device))].append(int(event.eventData))
            except nvml.NVMLError:
                continue
        return found

    def close(self) -> None:
        nvml = self.nvml
        for sample in self._gpm_samples.values():
            self._free(sample)
        self._gpm_samples.clear()
        try:
            if self._events is not None:
                nvml.nvmlEventSetFree(self._events)
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # the driver went away first


def _with_problems(reading, problems: list[str]):
    return replace(reading, problems=tuple(dict.fromkeys(problems))) if problems else reading
