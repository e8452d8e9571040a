"""gunicorn's settings for the portal's web process (`gunicorn --config deploy/gunicorn.conf.py portal.wsgi`).

On SIGTERM gunicorn stops accepting connections and gives the requests in flight `graceful_timeout`
seconds to finish before it stops its workers; the pod's `terminationGracePeriodSeconds` is longer than
that and its `preStop` pause, so that nothing is cut off mid-answer.
"""

import os

from portal import telemetry

bind = f"0.0.0.0:{os.environ.get('PORT', '8000')}"
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
