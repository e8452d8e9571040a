"""Values a process leaves in the shared cache for the others to read back (pools/selectors/kept.py,
monitoring/selectors/kept.py)."""

from __future__ import annotations

import pickle
from typing import Any

from django.core.cache import cache


def read_back(key: str) -> Any:
    """The value under `key`, or None where there is none or it cannot be read: one an earlier release left,
    whose classes have changed since, is worked out again rather than failing the view."""
    try:
        return cache.get(key)
    except (pickle.UnpicklingError, AttributeError, ImportError, TypeError):
        return None
