"""The demo of the apps billing's history stands on (portal, pools, billing), each app loaded as
`manage.py demo` loads it, in its own transaction. Monitoring's day of figures, most of the command's time,
is left out: tests/portal/test_demo.py runs the command whole."""

from io import StringIO

from django.db import transaction

from billing.demo import load as load_billing
from pools.demo import load as load_pools
from portal.demo import load as load_portal


def load_demo(out=None) -> StringIO:
    """Loads the demo of portal, pools and billing; returns what they wrote."""
    out = out or StringIO()
    for load in (load_portal, load_pools, load_billing):
        with transaction.atomic():
            load(out)
    return out
