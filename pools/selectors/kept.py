"""Values worked out from the whole fleet (the capacity picture, the capacity figures), kept while the
capacity version holds (pools/capacity_version.py).

Working one out reads every GPU: seconds at a hundred thousand GPUs. A process keeps the value it built or
read back while the version holds, for at most CAPACITY_PICTURE_SECONDS (a bound for any change that slips
past a bump). The process that builds a version's value also leaves it in the shared cache, so that the
other web and worker processes read it back instead of each building the same value again: under load
capacity changes every few seconds, and a build costs far more than reading it back. Only what was read
outside a transaction is shared: it is committed, so it is what every process would read; a transaction's
own value stays in its process.

A process holds one value of each kind, the one of the newest version it used, and lets it go before it
builds or reads back the next: what it keeps is bounded by the size of the fleet, not by how often capacity
changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from django.core.cache import cache
from django.db import transaction

from pools import capacity_version
from pools.conf import settings
from portal.shared_cache import read_back

T = TypeVar("T")


class Kept(Generic[T]):
    """One kind of value, built by `build()` from the database, under `name` in the shared cache."""

    def __init__(self, name: str, build: Callable[[], T]) -> None:
        self.key = f"pools:{name}:{{version}}"
        self.build = build
        self.held: tuple[int, float, T] | None = None  # this process's: version, built at (monotonic), value

    def get(self) -> T:
        version = capacity_version.current()  # read before the data: a later change bumps it again
        keep = settings.CAPACITY_PICTURE_SECONDS
        held = self.held
        if held and held[0] == version and time.monotonic() - held[1] < keep:
            return held[2]
        self.held = held = None
        key = self.key.format(version=version)
        shared = read_back(key) if keep > 0 else None
        if shared is not None:
            built_at, value = shared  # wall-clock time of the build, so that its age holds across processes
            age = max(0.0, time.time() - built_at)
        else:
            built_at, value, age = time.time(), self.build(), 0.0
            if keep > 0 and not transaction.get_connection().in_atomic_block:
                cache.set(key, (built_at, value), timeout=keep)
        self.held = (version, time.monotonic() - age, value)
        return value
