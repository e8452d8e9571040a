"""Drivers: the only way from the portal out to a cluster (see base.py for the protocol)."""

from pools.drivers.base import ClusterDriver, DriverError, driver_for

__all__ = ["ClusterDriver", "DriverError", "driver_for"]
