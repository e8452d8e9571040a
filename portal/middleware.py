"""Request guards of the whole site: bad input stops here, staff without two-factor go set it up, and
a service's refusal that escapes a view answers with its own status.

`BadInputMiddleware` is the one place that refuses what no view can use: a NUL
character anywhere in the address, the query or a form (PostgreSQL cannot store
one, so it would end as a server error deep in a query), an over-long query
value, or an unreadable form body. JSON bodies get the same rules in
`portal.parsers`.

`BareViewMiddleware`, ahead of it, hands a hot path's request to its view at once (see its class).
"""

from __future__ import annotations

import threading

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.shortcuts import redirect
from django.urls import ResolverMatch, resolve, reverse
from django.utils import translation
from django.utils.translation import gettext as _

from portal import shell
from portal.errors import PortalError, bad_input, refused
from portal.signin import staff_without_two_factor
from portal.sso.session import second_factor_at_provider

# Longest value one query parameter may have; filters, searches and `next` addresses fit easily.
MAX_QUERY_VALUE_LENGTH = 2048
FORM_CONTENT_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def input_problem(request: HttpRequest) -> str | None:
    """Why this request's address, query or form cannot be used, or None when it can."""
    if "\x00" in request.path:
        return _("The address contains a NUL character.")
    for name, values in request.GET.lists():
        if "\x00" in name or any("\x00" in value for value in values):
            return _("The query parameter %(name)s contains a NUL character.") % {"name": name.strip("\x00")}
        if any(len(value) > MAX_QUERY_VALUE_LENGTH for value in values):
            return _("The query parameter %(name)s is longer than %(max)s characters.") % {
                "name": name,
                "max": MAX_QUERY_VALUE_LENGTH,
            }
    if request.method in ("POST", "PUT", "PATCH") and request.content_type in FORM_CONTENT_TYPES:
        try:
            fields = list(request.POST.lists())
        except MultiPartParserError:
            return _("The form data could not be read.")
        for name, values in fields:
            if "\x00" in name or any("\x00" in value for value in values):
                return _("The form field %(name)s contains a NUL character.") % {"name": name.strip("\x00")}
    return None


class BadInputMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        problem = input_problem(request)
        if problem is not None:
            return bad_input(request, problem)
        return self.get_response(request)


class BareViewMiddleware:
    """Serves the apps' bare views (AppPlugin.bare_views: a node agent's POST, which every node of a
    fleet sends every 15 s) once the site's guards have let a request through (the probes, the request's
    id, metrics and log line, the HTTPS redirect and security headers), without the middleware that such a
    request never uses: a policy for documents (CSP), static files, the checks of queries and forms (a
    bare request has neither), sessions, CSRF, the signed-in user, messages, the sign-in flows. Of the
    rest, what it would use is done here: the host is checked against ALLOWED_HOSTS, the language taken
    from the request and the answer's length given. Only the requests the view's class says it serves whole
    (`serves_bare`, which must hold only for requests without a query or a form) come this way; any other
    request to it goes through the whole stack."""

    def __init__(self, get_response):
        self.get_response = get_response
        self._matches: dict[str, ResolverMatch] | None = None
        self._lock = threading.Lock()

    def matches(self) -> dict[str, ResolverMatch]:
        """The bare views by path, resolved on first use (URLs are not loaded at start-up)."""
        if self._matches is None:
            with self._lock:
                paths = (reverse(name) for plugin in shell.plugins() for name in plugin.bare_views)
                self._matches = {path: resolve(path) for path in paths}
        return self._matches

    def __call__(self, request: HttpRequest) -> HttpResponse:
        match = self.matches().get(request.path_info)
        if match is None or not match.func.view_class.serves_bare(request):
            return self.get_response(request)
        request.get_host()  # DisallowedHost (a 400) for a host not allowed, as CommonMiddleware would
        request.resolver_match = match
        with translation.override(translation.get_language_from_request(request)):
            response = match.func(request, *match.args, **match.kwargs)
        if not response.streaming and not response.has_header("Content-Length"):
            response["Content-Length"] = str(len(response.content))  # as CommonMiddleware adds it
        return response


class RefusalMiddleware:
    """A PortalError that leaves a view (e.g. a state changed between a form's check and its save)
    answers with its status and message, as the API does, instead of a server error."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return refused(request, exception) if isinstance(exception, PortalError) else None


class StaffTwoFactorMiddleware:
    """With `STAFF_REQUIRE_TOTP`, a staff session reaches nothing but the two-factor set-up (and
    sign-out, language, static files) until TOTP is on, unless it was signed in through an identity provider
    that says it asked for a second factor (portal/sso/session.py)."""

    def __init__(self, get_response):
        self.get_response = get_response
        self._open_prefixes: tuple[str, ...] | None = None

    def open_prefixes(self) -> tuple[str, ...]:
        if self._open_prefixes is None:  # resolved on first use: URLs are not loaded at start-up
            self._open_prefixes = (
                reverse("mfa_index"),
                reverse("account_reauthenticate"),
                reverse("account_logout"),
                reverse("set_language"),
                "/" + settings.STATIC_URL.lstrip("/"),
            )
        return self._open_prefixes

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (
            not request.path.startswith(self.open_prefixes())
            and staff_without_two_factor(request.user)
            and not second_factor_at_provider(request)
        ):
            message = _("Platform staff must turn on two-factor authentication before using the portal.")
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=403)
            messages.warning(request, message)
            return redirect("mfa_activate_totp")
        return self.get_response(request)
