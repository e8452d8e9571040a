"""gunicorn's settings for the portal's web process (`gunicorn --config deploy/gunicorn.conf.py portal.wsgi`).

On SIGTERM gunicorn stops accepting connections and gives the requests in flight `graceful_timeout`
seconds to finish before it stops its workers; the pod's `terminationGracePeriodSeconds` is longer than
that and its `preStop` pause, so that nothing is cut off mid-answer.
"""

import os

from portal import telemetry

_port = os.environ.get("PORT", "8000")
# With METRICS_PORT the web listens there too, for /metrics and nothing else (portal/telemetry.py): a port the
# pod's metrics Service names and its web Service, hence the Ingress, never does. A `--bind` on the command
# line (./scripts/run) replaces both.
_metrics_port = os.environ.get("METRICS_PORT", "0")
if _metrics_port == _port:
    raise RuntimeError(f"METRICS_PORT and PORT are both {_port}: metrics need a port of their own")
bind = [f"0.0.0.0:{_port}"] + ([f"0.0.0.0:{_metrics_port}"] if _metrics_port not in ("", "0") else [])
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
threads = int(os.environ.get("WEB_THREADS", "1"))
timeout = int(os.environ.get("WEB_TIMEOUT", "60"))
graceful_timeout = int(os.environ.get("WEB_GRACEFUL_TIMEOUT", "30"))
keepalive = 5
# Heartbeat files in memory, not on the container's (read-only) disk.
worker_tmp_dir = os.environ.get("WEB_WORKER_TMP_DIR", "/dev/shm" if os.path.isdir("/dev/shm") else None)
# The portal writes one line a request itself (portal.requests, with its request id); gunicorn's own
# access line would say it again in another format.
accesslog = None
errorlog = "-"
# Addresses of proxies whose X-Forwarded-* gunicorn believes; the portal's own TRUSTED_PROXY_COUNT decides
# which client address counts.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")


def on_starting(server) -> None:
    telemetry.reset_multiproc_dir()


def child_exit(server, worker) -> None:
    if telemetry.multiproc_dir() is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
