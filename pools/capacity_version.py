"""The capacity version: a number that changes whenever what placement sees may have changed.

Pages and the API read availability from a picture of the fleet that costs a
second or more to build at thousands of GPUs; they keep it while the version
holds (and at most CAPACITY_PICTURE_SECONDS, a bound for any change that slips
past a bump). Every write of capacity bumps the version at once and again after
commit: a reader that rebuilt in between, from data not yet committed, keeps its
picture only until the second bump.

The number lives in the shared cache, so every web and worker process agrees on
it; it starts at a random value, so a cleared cache never brings an old number
back.
"""

from __future__ import annotations

import secrets

from django.core.cache import cache
from django.db import transaction

KEY = "pools:capacity-version"


def current() -> int:
    version = cache.get(KEY)
    if version is None:
        cache.add(KEY, secrets.randbelow(2**62))
        version = cache.get(KEY)
    return version


def _bump() -> None:
    current()
    try:
        cache.incr(KEY)
    except ValueError:  # evicted between the two calls: a fresh random start is as good
        current()


def changed() -> None:
    """Capacity changed (or is changing in the current transaction): pictures built before are stale."""
    _bump()
    transaction.on_commit(_bump)
