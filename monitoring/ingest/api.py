"""REST API of monitoring, served under /api/v1/ by the site shell: node agents post their samples."""

from __future__ import annotations

from datetime import UTC, datetime

from django.core.exceptions import RequestDataTooBig
from django.db import transaction
from django.urls import path
from django.utils.translation import gettext as _
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from monitoring.collectors.wire import from_json
from monitoring.conf import settings
from monitoring.ingest import tokens
from monitoring.ingest.authentication import AgentTokenAuthentication, FromAgent
from monitoring.ingest.readings import accepted_times, ingest
from monitoring.ingest.serializers import BatchSerializer, RefusalSerializer, StoredSerializer
from portal.errors import InvalidInput
from portal.parsers import JSONParser


def _refusal(code: str, detail: str, *, status_code: int = status.HTTP_400_BAD_REQUEST, **extra) -> Response:
    return Response({"detail": detail, "code": code, **extra}, status=status_code)


def _content_length(request) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0


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


class SamplesView(APIView):
    """A node agent's batch of readings, stored whole or not at all, as the token's cluster's."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [FromAgent]
    parser_classes = [JSONParser]

    def permission_denied(self, request, message=None, code=None):
        if not request.successful_authenticator:
            raise exceptions.NotAuthenticated(FromAgent.message)
        super().permission_denied(request, message, code)

    @extend_schema(
        operation_id="monitoring_samples_create",
        summary="Post a node agent's readings",
        description=(
            "Readings of the agent's hosts, oldest first, in the JSON of the collectors' Reading. The "
            "batch is checked whole: anything wrong refuses it and nothing is stored. A batch sent twice "
            "is stored once. Refusals carry a `code`: `malformed`, `invalid` (with `errors`), "
            "`out_of_bounds` (with `readings`, the positions that will never be taken: drop them), "
            "`refused` (unknown host or GPU), `too_large` and `too_many` (413: send fewer at a time)."
        ),
        request=BatchSerializer,
        responses={
            200: StoredSerializer,
            400: RefusalSerializer,
            401: RefusalSerializer,
            413: RefusalSerializer,
        },
        tags=["monitoring"],
    )
    def post(self, request):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        too_large = _("The body is larger than %(max)s bytes. Send fewer readings at a time.") % {
            "max": limit
        }
        if limit is not None and _content_length(request) > limit:
            return _refusal("too_large", too_large, status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        try:
            data = request.data
        except exceptions.ParseError as error:
            return _refusal("malformed", str(error.detail))
        except RequestDataTooBig:
            return _refusal("too_large", too_large, status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        too_many = _too_many(data)
        if too_many:
            return _refusal("too_many", too_many, status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
        batch = BatchSerializer(data=data)
        if not batch.is_valid():
            return _refusal("invalid", _("The batch is not valid: see errors."), errors=batch.errors)
        readings = [from_json(reading) for reading in batch.validated_data["readings"]]

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

        token = request.auth
        try:
            with transaction.atomic():
                stored = ingest(
                    cluster=token.cluster, readings=readings, source="agent", strict=True, now=now
                )
                tokens.record_agent_host(token=token, host=readings[-1].host)
        except InvalidInput as error:
            return _refusal("refused", error.message)
        answer = {"samples": stored.samples, "gpus": stored.gpus, "events": len(stored.events)}
        return Response(StoredSerializer(answer).data)


router = SimpleRouter(trailing_slash=True)

urlpatterns: list = [path("monitoring/samples/", SamplesView.as_view(), name="monitoring-samples")]
