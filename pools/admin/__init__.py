"""Django admin of the pools app: capacity, the approvers' queue of pool requests, kept what-if runs
(pools/whatif/admin.py)."""

from pools.admin import capacity, requests
from pools.whatif import admin as whatif

__all__ = ["capacity", "requests", "whatif"]
