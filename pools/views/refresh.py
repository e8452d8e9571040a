"""Regions of the pools pages that refresh themselves while what they show is in between (a request
waiting, a pool provisioning, a what-if run going); static/portal/portal.js does the refreshing."""

from __future__ import annotations

# Seconds between refreshes of a page region showing work in between.
REFRESH_SECONDS = 10


def refresh_while(moving: bool) -> int | None:
    """The `data-refresh` of a region: set while something in it is in between, so that refreshing stops by
    itself once it settles."""
    return REFRESH_SECONDS if moving else None
