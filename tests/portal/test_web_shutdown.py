"""gunicorn with the portal's own settings (deploy/gunicorn.conf.py) drains on SIGTERM: it takes no new
connection, finishes the request in flight, and exits cleanly."""

import os
import signal
import subprocess
import sys
import threading
import time

import requests

from tests.conftest import ROOT
from tests.monitoring.dcgm_exporter import free_port


def test_sigterm_lets_the_request_in_flight_finish_and_refuses_new_ones(tmp_path):
    port = free_port()
    env = {**os.environ, "PORT": str(port), "WEB_CONCURRENCY": "1", "WEB_GRACEFUL_TIMEOUT": "10"}
    log = (tmp_path / "gunicorn.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "--config", "deploy/gunicorn.conf.py",
         "tests.portal.slow_wsgi:app"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert server.poll() is None, (tmp_path / "gunicorn.log").read_text()
            try:
                if requests.get(f"{base}/healthz", timeout=5).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):  # still starting
                pass
            assert time.monotonic() < deadline, (tmp_path / "gunicorn.log").read_text()
            time.sleep(0.2)

        answers = []
        slow = threading.Thread(target=lambda: answers.append(requests.get(f"{base}/slow/?3", timeout=20)))
        slow.start()
        time.sleep(1)  # the request is being served
        server.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        refused = False
        try:
            requests.get(f"{base}/healthz", timeout=1)
        except (requests.ConnectionError, requests.Timeout):
            refused = True
        slow.join(timeout=20)
        exit_code = server.wait(timeout=20)
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
    output = (tmp_path / "gunicorn.log").read_text()
    assert refused, "a new connection was taken after SIGTERM"
    assert [answer.status_code for answer in answers] == [200], output
    assert answers[0].json() == {"status": "ok"}
    assert exit_code == 0, output
