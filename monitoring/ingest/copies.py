"""This process's copies of what every agent's batch needs from the database: the token behind a key and
the identity of a host's GPUs.

A fleet of 100,000 GPUs posts 12,500 batches every 15 s, each from an agent whose token and host change
seldom; reading both for every batch cost two of the endpoint's three round trips. A web process keeps
what it read for MONITORING_AGENT_COPY_SECONDS, MONITORING_AGENT_COPIES entries of each kind at most (the
oldest go first), and reads again once a copy is that old; tokens it reads all at once, at the first it
does not hold (monitoring.ingest.tokens), and a cluster's hosts likewise (monitoring.ingest.hosts). A copy
never decides alone:

- a token: its revocation reaches every process at once through the broker (monitoring.ingest.broker),
  checked in the same call that leaves the batch for the writer; the writer stores nothing a token brought
  after it was revoked, whatever a copy said (nor anything of a cluster deleted with its tokens, which
  copies may still take until they are that old);
- a host: a batch its copy would refuse is checked again on a fresh read before it is refused; one its copy
  takes is stored by the writer against the hosts' present GPUs, which passes over a GPU gone since.

With MONITORING_AGENT_COPY_SECONDS = 0 every batch reads both again.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable, Iterable

from cachetools import TTLCache

from monitoring.conf import settings

_lock = threading.Lock()  # gunicorn's threads share a process's copies


@functools.cache
def _kept(kind: str, most: int, seconds: int) -> TTLCache:
    return TTLCache(maxsize=most, ttl=seconds)


def _of(kind: str) -> TTLCache:
    return _kept(kind, settings.MONITORING_AGENT_COPIES, settings.MONITORING_AGENT_COPY_SECONDS)


def get(kind: str, key: Hashable):
    """This process's copy of `key` among `kind`, if one is kept and young enough; else None."""
    if not settings.MONITORING_AGENT_COPY_SECONDS:
        return None
    with _lock:
        return _of(kind).get(key)


def keep(kind: str, key: Hashable, value) -> None:
    keep_all(kind, ((key, value),))


def keep_all(kind: str, items: Iterable[tuple[Hashable, object]]) -> None:
    """Keep each (key, value) of `items` among `kind`, the lock taken once (a cluster's hosts at a time)."""
    if not settings.MONITORING_AGENT_COPY_SECONDS:
        return
    with _lock:
        kept = _of(kind)
        for key, value in items:
            kept[key] = value


def read_all(kind: str, key: Hashable, read: Callable[[], object]) -> bool:
    """Call `read`, which keeps copies among `kind` of all there is under `key` at once (every live token, a
    cluster's hosts), unless this process did within a copy's life; whether it did now."""
    done = f"{kind}:all-read"
    if not settings.MONITORING_AGENT_COPY_SECONDS or get(done, key) is not None:
        return False
    read()
    keep(done, key, True)
    return True


def forget(kind: str, key: Hashable) -> None:
    with _lock:
        _of(kind).pop(key, None)


def forget_all() -> None:
    """Every copy of every kind this process holds (tests start from none)."""
    with _lock:
        _kept.cache_clear()
