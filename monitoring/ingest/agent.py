"""The node agent: reads this host's GPUs every interval and pushes the readings to the portal
(POST /api/v1/monitoring/samples/ with the agent's token), keeping them while the portal cannot take them.
It needs no database: only the portal's address and a token. `manage.py gpu_agent` runs it.

Policy, in the order a reading meets it:
- Every interval the collector is read and each reading joins the buffer, a queue of at most `buffer_size`
  readings. A full buffer drops its oldest reading, and the agent logs how many it has dropped so far.
- Buffered readings are sent oldest first, at most `batch_size` in one POST. A batch leaves the buffer only
  when the portal takes it (202; 200 from a portal that stored batches as they came); the portal stores a
  batch sent twice once, so a lost answer costs nothing.
- No answer (network error, time-out), 5xx, 401/403 (a token not yet known, or revoked: an operator acts)
  or 429: everything stays; the next try waits `retry_delay(failures)`, an exponential back-off with
  jitter, capped, reset by the next success. Readings are still taken meanwhile.
- 413: the batch is too large for the portal: it is sent in halves. A single reading too large for the
  portal can never be taken and is dropped.
- 400 with code `out_of_bounds`: the readings it names are older (or further ahead) than the portal will
  ever take: just those are dropped, the rest goes on. Any other 400 (an unknown host or GPU, a bad
  figure): the portal's reason is logged and the batch is kept, as for the portal being away; the bounded
  buffer limits what waits for an operator.
- Stopping (SIGTERM, Ctrl-C): one last try to send what is buffered.
"""

from __future__ import annotations

import json
import logging
import math
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import requests

from monitoring.collectors.base import Collector, Reading
from monitoring.collectors.wire import batch_to_json

log = logging.getLogger(__name__)

SAMPLES_PATH = "/api/v1/monitoring/samples/"
DEFAULT_INTERVAL = 15.0
DEFAULT_BUFFER_SECONDS = 4 * 3600  # within what the portal still takes (MONITORING_SAMPLE_MAX_AGE_SECONDS)
DEFAULT_BATCH = 60
DEFAULT_TIMEOUT = 10.0
BACKOFF_BASE = 2.0
BACKOFF_CAP = 300.0
JITTER = 0.5  # a delay is between (1 - JITTER) and 1 times its step, so agents restarted together spread


def retry_delay(failures: int, *, rand: float, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Seconds to wait before the next try after `failures` failed tries in a row (none: 0).

    The step doubles from `base` with each failure up to `cap`; `rand` in [0, 1) takes up to JITTER of it
    away, so that agents failing together do not come back together."""
    if failures <= 0:
        return 0.0
    step = min(cap, base * 2.0 ** min(failures - 1, 64))
    return step * (1 - JITTER * rand)


def default_buffer_size(interval: float) -> int:
    return max(1, math.ceil(DEFAULT_BUFFER_SECONDS / interval))


@dataclass(frozen=True)
class Answer:
    """What the portal said to one POST; `status` None when it said nothing (network error, time-out)."""

    status: int | None
    body: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def code(self) -> str:
        return str(self.body.get("code", ""))

    @property
    def reason(self) -> str:
        if self.status is None:
            return self.error or "no answer"
        detail = self.body.get("detail")
        if self.status == 400 and self.code == "invalid" and isinstance(self.body.get("errors"), dict):
            detail = f"{detail} {json.dumps(self.body['errors'])[:500]}"
        return f"the portal answered {self.status}" + (f": {detail}" if detail else "")


def _cause(error: requests.RequestException) -> str:
    """The root of a connection error in a few words ("[Errno 111] Connection refused")."""
    reason = error.args[0] if error.args else error
    reason = getattr(reason, "reason", reason)  # urllib3 wraps the cause in a MaxRetryError
    return re.sub(r"^.*?[)>]: ", "", str(reason)) or type(error).__name__


class Portal:
    """The portal's samples endpoint, over HTTP."""

    def __init__(self, base_url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT):
        self.url = base_url.rstrip("/") + SAMPLES_PATH
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json"})

    def send(self, readings: Sequence[Reading]) -> Answer:
        body = json.dumps(batch_to_json(readings), allow_nan=False, separators=(",", ":")).encode()
        try:
            response = self.session.post(
                self.url,
                data=body,
                headers={"Content-Type": "application/json"},
                timeout=self.timeout,
                allow_redirects=False,  # a redirected POST would arrive as a GET; say so instead
            )
        except requests.Timeout:
            return Answer(None, error=f"no answer from {self.url} within {self.timeout:g} s")
        except requests.RequestException as error:
            return Answer(None, error=f"cannot reach {self.url}: {_cause(error)}")
        try:
            document = response.json()
        except ValueError:
            document = {}
        if not isinstance(document, dict):
            document = {}
        if 300 <= response.status_code < 400:
            document.setdefault("detail", f"redirected to {response.headers.get('Location', '?')}")
        return Answer(response.status_code, document)

    def close(self) -> None:
        self.session.close()


class Agent:
    """Reads `collector` into a bounded buffer and sends the buffer to `portal` (see the module's policy).

    Time comes from `clock` (seconds, monotonic) and jitter from `rand`, so tests drive both."""

    def __init__(
        self,
        *,
        collector: Collector,
        portal: Portal,
        interval: float = DEFAULT_INTERVAL,
        buffer_size: int | None = None,
        batch_size: int = DEFAULT_BATCH,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ):
        if interval <= 0 or batch_size < 1 or (buffer_size is not None and buffer_size < 1):
            raise ValueError("interval, buffer and batch sizes must be positive")
        self.collector = collector
        self.portal = portal
        self.interval = interval
        self.buffer_size = buffer_size or default_buffer_size(interval)
        self.batch_size = batch_size
        self.clock = clock
        self.rand = rand
        self.buffer: deque[Reading] = deque()
        self.dropped = 0  # readings lost to a full buffer
        self.refused = 0  # readings the portal will never take (too old, too far ahead, too large)
        self.sent = 0
        self.failures = 0  # failed tries in a row
        self.next_try = 0.0  # no send before this clock time
        self.last_failure = ""
        self._stop = threading.Event()

    # --- reading -----------------------------------------------------------------------------------

    def collect(self) -> int:
        """Read the collector once into the buffer; returns how many readings joined it."""
        try:
            readings = self.collector.readings()
        except Exception as error:  # a collector that fails once must not end the agent
            log.warning("Could not read the GPUs: %s", error)
            return 0
        for reading in readings:
            if len(self.buffer) >= self.buffer_size:
                self.buffer.popleft()
                self.dropped += 1
                log.warning(
                    "The buffer is full (%d readings): dropped the oldest; %d dropped so far.",
                    self.buffer_size,
                    self.dropped,
                )
            self.buffer.append(reading)
        return len(readings)

    # --- sending -----------------------------------------------------------------------------------

    def flush(self) -> bool:
        """One try to send the buffer, oldest first, until it is empty (True) or the portal cannot take
        a batch (False: `last_failure` says why, and the next try waits its back-off)."""
        size = self.batch_size
        while self.buffer:
            count = min(size, len(self.buffer))
            batch = list(islice(self.buffer, count))
            answer = self.portal.send(batch)
            if answer.status in (200, 202):  # stored, or taken to be stored
                for _ in range(count):
                    self.buffer.popleft()
                self.sent += count
                self.failures = 0
                continue
            if answer.status == 413:
                if count > 1:
                    size = count // 2  # the rest of this try goes in batches this small
                    continue
                self.buffer.popleft()
                self.refused += 1
                log.error("Dropped a reading the portal will never take: %s", answer.reason)
                continue
            if answer.status == 400 and answer.code == "out_of_bounds" and self._drop_named(answer, count):
                continue
            return self._failed(answer)
        self.failures = 0
        self.next_try = 0.0
        return True

    def _drop_named(self, answer: Answer, count: int) -> bool:
        """Drop the readings of the batch (the first `count` buffered) that the answer names."""
        named = answer.body.get("readings")
        if not isinstance(named, list):
            return False
        positions = sorted({n for n in named if isinstance(n, int) and 0 <= n < count}, reverse=True)
        if not positions:
            return False
        for position in positions:
            del self.buffer[position]
        self.refused += len(positions)
        log.error("Dropped %d readings the portal will never take: %s", len(positions), answer.reason)
        return True

    def _failed(self, answer: Answer) -> bool:
        self.failures += 1
        delay = retry_delay(self.failures, rand=self.rand())
        self.next_try = self.clock() + delay
        self.last_failure = answer.reason
        log.warning(
            "Could not send %d readings (%s); next try in %.0f s.", len(self.buffer), answer.reason, delay
        )
        return False

    # --- the loop ----------------------------------------------------------------------------------

    def tick(self) -> None:
        """One interval: read, then send unless a back-off is pending."""
        self.collect()
        if self.buffer and self.clock() >= self.next_try:
            self.flush()

    def run(self) -> None:
        """Read every interval and send until `stop()`; then one last try to send what is left."""
        next_read = self.clock()
        while not self._stop.is_set():
            now = self.clock()
            if now >= next_read:
                self.collect()
                next_read = max(next_read + self.interval, now)  # a slow send skips readings, never bunches
            if self.buffer and self.clock() >= self.next_try:
                self.flush()
            wake = next_read if not self.buffer else min(next_read, self.next_try)
            self._stop.wait(max(0.0, wake - self.clock()))
        self.last_flush()

    def stop(self) -> None:
        self._stop.set()

    def last_flush(self) -> None:
        if self.buffer and not self.flush():
            log.warning("Stopping with %d readings not sent: %s", len(self.buffer), self.last_failure)
