"""Template context every page needs."""

from django.conf import settings
from django.utils.functional import SimpleLazyObject

from portal import shell


def portal(request) -> dict:
    return {
        "signup_open": settings.PORTAL_OPEN_SIGNUP,
        # The top bar's links of every app, worked out only by a page that draws them.
        "nav_links": SimpleLazyObject(lambda: shell.nav_links(request.user)),
    }
