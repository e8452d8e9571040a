"""Django admin of the pools app: capacity, the approvers' queue of pool requests, kept what-if runs."""

from pools.admin import capacity, requests, whatif

__all__ = ["capacity", "requests", "whatif"]
