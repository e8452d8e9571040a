"""REST API of monitoring, served under /api/v1/ by the site shell: node agents post their samples.

An agent's POST is the portal's hot path (a fleet of 100,000 GPUs posts 12,500 batches every 15 s), so the
usual one, JSON in and out, is served bare (portal.middleware.BareViewMiddleware) and without the framework's
dispatch: its token found (this process's copy, else one query: monitoring.ingest.copies), the body read
and checked in C when it is plainly right, else parsed once and checked by hand (monitoring.ingest.batch),
its hosts and GPUs checked (readings.check, on copies too), its readings left to the writer that stores many
batches at once (monitoring.ingest.accepted), the answer (202) rendered by the framework's own renderer, with
the headers its dispatch adds. Any other request (another media type, Accept header, query or method) goes
through the whole middleware and the framework's dispatch, so that its answers stay the framework's; both
paths share all that follows the parsing of the body, so they answer alike.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

import redis
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from django.urls import path
from django.utils.cache import patch_vary_headers
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from monitoring.collectors import Reading
from monitoring.conf import settings
from monitoring.ingest import accepted, tokens
from monitoring.ingest.authentication import (
    KEYWORD,
    NOT_VALID_OR_REVOKED,
    AgentTokenAuthentication,
    FromAgent,
    agent_key,
)
from monitoring.ingest.batch import Invalid, check_batch, only_known_keys, plain_batch
from monitoring.ingest.hosts import accepted_times
from monitoring.ingest.readings import check
from monitoring.ingest.serializers import AcceptedSerializer, BatchSerializer, RefusalSerializer
from monitoring.models import AgentToken
from portal.errors import InvalidInput
from portal.parsers import JSONParser, check_document
from portal.tokens import record_use

log = logging.getLogger(__name__)

_JSON = "application/json"
_ACCEPTED = frozenset({"", "*/*", _JSON})  # Accept headers the framework answers with its JSON renderer
_UTF8 = frozenset({"utf-8", "utf8"})
_RENDERER = JSONRenderer()


@dataclass(frozen=True)
class _Answer:
    status: int
    data: dict
    headers: dict = field(default_factory=dict)


def _refusal(code: str, detail: str, *, status_code: int = status.HTTP_400_BAD_REQUEST, **extra) -> _Answer:
    return _Answer(status_code, {"detail": detail, "code": code, **extra})


def _unauthorized(detail: str) -> _Answer:
    """A 401 that names the agents' scheme, as the framework answers a missing or bad token."""
    return _Answer(status.HTTP_401_UNAUTHORIZED, {"detail": detail}, {"WWW-Authenticate": KEYWORD})


def _too_large() -> _Answer:
    detail = _("The body is larger than %(max)s bytes. Send fewer readings at a time.") % {
        "max": settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    }
    return _refusal("too_large", detail, status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)


def _content_length(request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


def _declares_too_much(request) -> bool:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit is not None and _content_length(request) > limit


def _too_many(data) -> str | None:
    """Why the batch holds more than one batch may, counted before any reading is checked, or None."""
    readings = data.get("readings") if isinstance(data, dict) else None
    if not isinstance(readings, list):
        return None
    if len(readings) > settings.MONITORING_BATCH_MAX_READINGS:
        return _("A batch holds at most %(max)s readings; this one has %(count)s. Send fewer at a time.") % {
            "max": settings.MONITORING_BATCH_MAX_READINGS,
            "count": len(readings),
        }
    gpus = sum(
        len(reading["gpus"])
        for reading in readings
        if isinstance(reading, dict) and isinstance(reading.get("gpus"), list)
    )
    if gpus > settings.MONITORING_BATCH_MAX_GPUS:
        return _(
            "A batch holds at most %(max)s GPU readings; this one has %(count)s. Send fewer at a time."
        ) % {
            "max": settings.MONITORING_BATCH_MAX_GPUS,
            "count": gpus,
        }
    return None


def _take(token: AgentToken, data, *, walked: bool) -> _Answer:
    """The answer to a parsed batch from `token`'s agent, accepted for storage when it is right. `walked`:
    whether the whole document was checked for NUL characters and depth already
    (portal.parsers.check_document); if not, it is checked before any refusal, and wherever the batch holds
    keys it does not name (they may hide anything), since the parser's refusal comes before any other."""
    try:
        too_many = _too_many(data)
        if too_many:
            if not walked:
                check_document(data)
            return _refusal("too_many", too_many, status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        try:
            readings = check_batch(data)
        except Invalid as invalid:
            if not walked:
                check_document(data)
            return _refusal("invalid", _("The batch is not valid: see errors."), errors=invalid.errors)
        if not walked and not only_known_keys(data):
            check_document(data)
    except exceptions.ParseError as error:
        return _refusal("malformed", str(error.detail))
    return _take_checked(token, readings)


def _take_checked(token: AgentToken, readings: list[Reading]) -> _Answer:
    """The answer to `token`'s batch of `readings`, checked as the batch's rules say."""
    now = datetime.now(UTC)
    oldest, newest = accepted_times(now=now)
    outside = [n for n, reading in enumerate(readings) if not oldest <= reading.at <= newest]
    if outside:
        detail = _(
            "%(count)s of the readings are outside the times the portal takes (%(oldest)s to "
            "%(newest)s) and never will be taken: see readings. Is the host's clock right?"
        ) % {
            "count": len(outside),
            "oldest": oldest.isoformat(timespec="seconds"),
            "newest": newest.isoformat(timespec="seconds"),
        }
        return _refusal("out_of_bounds", detail, readings=outside)

    try:
        checked = check(cluster=token.cluster, readings=readings, now=now)
    except InvalidInput as error:
        return _refusal("refused", error.message)
    try:
        accepted.put(cluster_id=token.cluster_id, token_id=token.pk, at=now, readings=readings)
    except accepted.Revoked:
        tokens.forget_agent_token(token)
        return _unauthorized(NOT_VALID_OR_REVOKED)
    except accepted.Full:
        detail = _("The portal has more readings waiting to be stored than it keeps. Send them again later.")
        return _refusal("busy", detail, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    except (redis.RedisError, OSError):
        log.exception("Could not leave an agent's batch for the writer")
        detail = _("The portal cannot take readings now: its queue does not answer. Send them again later.")
        return _refusal("unavailable", detail, status_code=status.HTTP_503_SERVICE_UNAVAILABLE)
    return _Answer(status.HTTP_202_ACCEPTED, {"samples": checked.samples, "gpus": checked.gpus})


def _plain_json(request) -> bool:
    """Whether the framework would read this POST with its JSON parser as UTF-8 and answer with its JSON
    renderer, with nothing else to take into account (a query might name a format)."""
    if request.content_type != _JSON or request.META.get("QUERY_STRING"):
        return False
    params = request.content_params
    if params and (params.keys() != {"charset"} or params["charset"].lower() not in _UTF8):
        return False
    return request.META.get("HTTP_ACCEPT", "").strip() in _ACCEPTED


def _refuse_constant(name: str):
    raise ValueError(name)


def _parse(body: bytes) -> tuple[object, bool]:
    """The document in `body`, and whether it was walked whole for NUL characters and depth; ParseError,
    with the parser's own words, when the parser refuses it."""
    if not body:
        return {}, True  # as the framework takes a POST without a body
    try:
        text = body.decode()
        data = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return JSONParser().parse(io.BytesIO(body), _JSON, {"encoding": "utf-8"}), True
    # A NUL can only come as the escape \u0000; without it, only depth is left to check (see _take).
    if "\\u0000" in text:
        check_document(data)
        return data, True
    return data, False


def _take_plain(request) -> _Answer:
    """The answer to an agent's POST of JSON, read and answered without the framework's dispatch."""
    try:
        key = agent_key(request)
    except exceptions.AuthenticationFailed as failed:
        return _unauthorized(failed.detail)
    token = tokens.find_agent_token(key) if key is not None else None
    if token is None:
        detail = FromAgent.message if key is None else NOT_VALID_OR_REVOKED
        return _unauthorized(detail)
    if _declares_too_much(request):
        answer = _too_large()
    else:
        try:
            readings = plain_batch(
                request.body,
                max_readings=settings.MONITORING_BATCH_MAX_READINGS,
                max_gpus=settings.MONITORING_BATCH_MAX_GPUS,
            )
            if readings is not None:
                answer = _take_checked(token, readings)
            else:
                data, walked = _parse(request.body)
                answer = _take(token, data, walked=walked)
        except RequestDataTooBig:
            answer = _too_large()
        except exceptions.ParseError as error:
            answer = _refusal("malformed", str(error.detail))
    if answer.status not in (status.HTTP_202_ACCEPTED, status.HTTP_401_UNAUTHORIZED):
        record_use(token)  # the writer notes a batch taken, with its host; a revoked token is not used
    return answer


class SamplesView(APIView):
    """A node agent's batch of readings, taken whole or not at all, as the token's cluster's."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [FromAgent]
    parser_classes = [JSONParser]

    @staticmethod
    def serves_bare(request) -> bool:
        """An agent's usual POST needs nothing of the middleware past the site's guards (see dispatch)."""
        return request.method == "POST" and _plain_json(request)

    def dispatch(self, request, *args, **kwargs):
        if self.serves_bare(request):
            answer = _take_plain(request)
            response = HttpResponse(_RENDERER.render(answer.data), status=answer.status, content_type=_JSON)
            for name, value in answer.headers.items():
                response[name] = value
            # What the framework's dispatch adds to every answer of this view.
            headers = self.default_response_headers
            vary = headers.pop("Vary", None)
            if vary is not None:
                patch_vary_headers(response, [vary])
            for name, value in headers.items():
                response[name] = value
            return response
        return super().dispatch(request, *args, **kwargs)

    def permission_denied(self, request, message=None, code=None):
        if not request.successful_authenticator:
            raise exceptions.NotAuthenticated(FromAgent.message)
        super().permission_denied(request, message, code)

    @extend_schema(
        operation_id="monitoring_samples_create",
        summary="Post a node agent's readings",
        description=(
            "Readings of the agent's hosts, oldest first, in the JSON of the collectors' Reading. The "
            "batch is checked whole as it comes: anything wrong refuses it and nothing is stored. A batch "
            "taken is answered 202 and stored within seconds, with many others in one transaction; a batch "
            "sent twice is stored once. Refusals carry a `code`: `malformed`, `invalid` (with `errors`), "
            "`out_of_bounds` (with `readings`, the positions that will never be taken: drop them), "
            "`refused` (unknown host or GPU), `too_large` and `too_many` (413: send fewer at a time), "
            "`busy` and `unavailable` (503: too much waits to be stored, or the portal's queue does not "
            "answer; keep the readings and send them again later)."
        ),
        request=BatchSerializer,
        responses={
            202: AcceptedSerializer,
            400: RefusalSerializer,
            401: RefusalSerializer,
            413: RefusalSerializer,
            503: RefusalSerializer,
        },
        tags=["monitoring"],
    )
    def post(self, request):
        if _declares_too_much(request):
            answer = _too_large()
        else:
            try:
                answer = _take(request.auth, request.data, walked=True)
            except exceptions.ParseError as error:
                answer = _refusal("malformed", str(error.detail))
            except RequestDataTooBig:
                answer = _too_large()
        return Response(answer.data, status=answer.status, headers=answer.headers)


router = SimpleRouter(trailing_slash=True)

urlpatterns: list = [path("monitoring/samples/", SamplesView.as_view(), name="monitoring-samples")]
