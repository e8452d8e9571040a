"""Django admin of the pools app: capacity, and the approvers' queue of pool requests."""

from pools.admin import capacity, requests

__all__ = ["capacity", "requests"]
