"""Django admin of the pools app: capacity, the approvers' queue of pool requests, quotas, kept what-if runs
(pools/whatif/admin.py)."""

from pools.admin import capacity, quotas, requests
from pools.whatif import admin as whatif

__all__ = ["capacity", "quotas", "requests", "whatif"]
