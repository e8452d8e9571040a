"""Template context every page needs."""

from django.conf import settings
from django.urls import reverse
from django.utils.functional import SimpleLazyObject
from django.utils.translation import gettext_lazy as _

from portal import shell

# The portal's own pages in the top bar, after the apps' (the shell's plugins are the apps').
PORTAL_NAV = (shell.Link(_("Audit"), "audit", permission="portal.view_auditentry"),)


def nav_links(user) -> list[shell.Shown]:
    own = [shell.Shown(link.label, reverse(link.url_name)) for link in PORTAL_NAV if link.visible_to(user)]
    return [*shell.nav_links(user), *own]


def portal(request) -> dict:
    return {
        "signup_open": settings.PORTAL_OPEN_SIGNUP,
        # Whether people other than superusers may sign in with a password (else only through a provider).
        "local_passwords": settings.LOCAL_PASSWORDS,
        # The top bar's links of every app, worked out only by a page that draws them.
        "nav_links": SimpleLazyObject(lambda: nav_links(request.user)),
    }
