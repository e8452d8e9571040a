"""Template context every page needs."""

from django.conf import settings


def portal(request) -> dict:
    return {"signup_open": settings.PORTAL_OPEN_SIGNUP}
