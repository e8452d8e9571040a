"""A stand-in dcgm-exporter and a real Prometheus scraping it, for tests of what reads GPU figures from a
cluster's Prometheus.

`exposition()` writes a host's devices the way NVIDIA's dcgm-exporter does (HELP and TYPE per field, then
one line per entity, its labels in the exporter's order), for example:

    # HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).
    # TYPE DCGM_FI_DEV_FB_USED gauge
    DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-…",pci_bus_id="00000000:18:00.0",device="nvidia0",
        modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1",Hostname="dgx-a",
        DCGM_FI_DRIVER_VERSION="550.90.07",container="trainer",namespace="team-a",pod="bert-0"} 30720

`DcgmExporter` serves such text at /metrics and counts the scrapes since the text last changed, so a
test can change what a host reports and wait until Prometheus has stored it. `running_prometheus()`
starts the Prometheus binary of the Debian package `prometheus` scraping given exporters every second.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

# name: (type, help), as dcgm-exporter's counters file words them
FIELDS = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", "Total number of single-bit persistent ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Total number of double-bit persistent ECC errors."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
}


@dataclass(frozen=True)
class Device:
    """An entity dcgm-exporter reports: a whole GPU, or with `mig` one GPU instance of it (its `uuid`
    is then its GPU's, as the exporter labels it). An empty label value leaves the label out."""

    gpu: int | str
    uuid: str
    model: str
    fields: dict[str, float | str]  # field → value; a string is written as is ("NaN")
    mig: tuple[str, int | str] | None = None  # (GPU_I_PROFILE, GPU_I_ID)
    pod: tuple[str, str, str] | None = None  # (namespace, pod, container) holding the device
    pci_bus_id: str = "00000000:18:00.0"

    def labels(self, hostname: str, driver: str) -> dict[str, str]:
        profile, instance = self.mig or ("", "")
        namespace, pod, container = self.pod or ("", "", "")
        labels = {
            "gpu": str(self.gpu),
            "UUID": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "device": f"nvidia{self.gpu}",
            "modelName": self.model,
            "GPU_I_PROFILE": profile,
            "GPU_I_ID": str(instance),
            "Hostname": hostname,
            "DCGM_FI_DRIVER_VERSION": driver,
            "container": container,
            "namespace": namespace,
            "pod": pod,
        }
        return {name: value for name, value in labels.items() if value}


def exposition(hostname: str, devices: Iterable[Device], *, driver: str = "550.90.07") -> str:
    """The /metrics text of one host's dcgm-exporter."""
    devices = list(devices)
    lines = []
    for name, (kind, help_text) in FIELDS.items():
        reporting = [device for device in devices if name in device.fields]
        if not reporting:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for device in reporting:
            labels = ",".join(f'{k}="{v}"' for k, v in device.labels(hostname, driver).items())
            lines.append(f"{name}{{{labels}}} {device.fields[name]}")
    return "\n".join(lines) + "\n"


@dataclass
class DcgmExporter:
    """Serves `text` at http://127.0.0.1:<port>/metrics; `serve()` changes it between scrapes."""

    text: str = ""
    served: int = 0  # scrapes since the text last changed
    _http: ThreadingHTTPServer | None = None
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @property
    def target(self) -> str:
        assert self._http is not None, "the exporter is not started"
        return f"127.0.0.1:{self._http.server_address[1]}"

    def serve(self, text: str) -> None:
        with self._changed:
            self.text, self.served = text, 0

    def wait_served(self, times: int = 2, timeout: float = 15) -> None:
        """Until the current text went out `times` times: the scrape before the last is stored then."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.served >= times, timeout):
                raise AssertionError(f"{self.target} was scraped {self.served} times in {timeout} s")

    def start(self) -> DcgmExporter:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with exporter._changed:
                    body = exporter.text.encode()
                    exporter.served += 1
                    exporter._changed.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


PROMETHEUS = "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_prometheus(exporters: list[DcgmExporter], workdir: Path, *, timeout: float = 30) -> Iterator[str]:
    """A real Prometheus scraping the exporters every second, until each target is up; yields its URL."""
    binary = PROMETHEUS if Path(PROMETHEUS).exists() else shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            f"No Prometheus binary at {PROMETHEUS}: install the Debian package `prometheus` "
            "(apt-get install -y prometheus); these tests read from a real Prometheus."
        )
    targets = [exporter.target for exporter in exporters]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "honor_labels": True,  # the exporter's Hostname and pod labels are the truth
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    url = f"http://127.0.0.1:{free_port()}"
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={url.removeprefix('http://')}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_until_scraping(process, url, len(targets), workdir / "prometheus.log", timeout)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_scraping(
    process: subprocess.Popen, url: str, targets: int, log: Path, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    step = "start"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"Prometheus exited ({process.returncode}): {log.read_text()[-2000:]}")
        with suppress(OSError, ValueError):
            if step == "start":
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
                    step = "scrape" if answer.status == 200 else step
            else:
                with urllib.request.urlopen(f"{url}/api/v1/query?query=up%3D%3D1", timeout=1) as answer:
                    if len(json.load(answer)["data"]["result"]) == targets:
                        return
        time.sleep(0.1)
    pytest.fail(
        f"Prometheus at {url} was not scraping {targets} targets after {timeout} s ({step}): "
        f"{log.read_text()[-2000:]}"
    )
