"""Domain errors and how pages and the API turn them into 4xx answers.

Services raise `PortalError` subclasses with a message a person can read; the
API answers them as `{"detail": ...}` with the subclass's status, pages show the
message. Anything under /api/ answers JSON even for 404 and 500.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils.translation import gettext as _
from django.views import defaults
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.views import exception_handler


class PortalError(Exception):
    """A request the domain refuses; `message` is shown to the user as is.

    `field` names the input at fault where there is one, so that a form shows the message beside it.
    """

    status_code = status.HTTP_400_BAD_REQUEST

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(PortalError):
    status_code = status.HTTP_400_BAD_REQUEST


class NotAllowed(PortalError):
    """The user can see the object but their role does not allow the change."""

    status_code = status.HTTP_403_FORBIDDEN


class Conflict(PortalError):
    """The change clashes with the current state (a duplicate, a wrong state)."""

    status_code = status.HTTP_409_CONFLICT


def api_exception_handler(exc, context):
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()  # the same answer whether the object is missing or foreign
    elif isinstance(exc, PortalError):
        api_exc = exceptions.APIException(detail=exc.message)
        api_exc.status_code = exc.status_code
        exc = api_exc
    return exception_handler(exc, context)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def page_not_found(request: HttpRequest, exception: Exception | None = None):
    if _is_api(request):
        return JsonResponse({"detail": _("Not found.")}, status=404)
    return defaults.page_not_found(request, exception)


# Unknown API addresses: a JSON 404 whatever the method, never the CSRF page of a form.
api_not_found = csrf_exempt(page_not_found)


def bad_input(request: HttpRequest, reason: str) -> HttpResponse:
    """A 400 that says what was wrong: JSON under /api/, the error page elsewhere."""
    if _is_api(request):
        return JsonResponse({"detail": reason}, status=400)
    return render(request, "400.html", {"reason": reason}, status=400)


def refused(request: HttpRequest, error: PortalError) -> HttpResponse:
    """A service's refusal that no view turned into an answer: its status and message, never a 500."""
    if _is_api(request):
        return JsonResponse({"detail": error.message}, status=error.status_code)
    context = {"status": error.status_code, "reason": error.message}
    return render(request, "refused.html", context, status=error.status_code)


def csrf_failure(request: HttpRequest, reason: str = ""):
    if _is_api(request):
        message = _("CSRF check failed: send the X-CSRFToken header with a session, or use a token.")
        return JsonResponse({"detail": message}, status=403)
    return django_csrf_failure(request, reason)


def permission_denied(request: HttpRequest, exception: Exception | None = None):
    if _is_api(request):
        return JsonResponse({"detail": _("You do not have permission to do this.")}, status=403)
    return defaults.permission_denied(request, exception)


def bad_request(request: HttpRequest, exception: Exception | None = None):
    if isinstance(exception, RequestDataTooBig):
        reason = _("The request body is larger than %(max)s bytes.") % {
            "max": settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        }
    elif isinstance(exception, TooManyFieldsSent):
        reason = _("The request has more than %(max)s fields.") % {
            "max": settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        }
    elif _is_api(request):
        return JsonResponse({"detail": _("Bad request.")}, status=400)
    else:
        return defaults.bad_request(request, exception)
    return bad_input(request, reason)


def server_error(request: HttpRequest):
    if _is_api(request):
        return JsonResponse({"detail": _("Server error.")}, status=500)
    return defaults.server_error(request)
