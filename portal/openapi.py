"""How the OpenAPI schema (`/api/schema/`) describes the API's refusals, for every operation at once.

Each view declares what it answers when it succeeds; what it answers when it refuses follows from how
the API is built, so it is added here rather than on every view:

- 400 `ValidationError`: a body that does not parse or fails its serializer, or a query parameter out of
  range (every list's `limit` and `offset`), as `{"detail": ...}` or `{"field": [messages]}`;
- 401 `Error`: no token, or one that is not valid, where the view authenticates;
- 403 `Error`: a role that may not make the change (and a session call without its CSRF token);
- 404 `Error`: an object that does not exist or belongs to another tenant (the same answer);
- 409 `Error`: a change to a collection or an object that clashes with its state (`portal.errors.Conflict`);
- 429 `Error`: too many attempts, where the view is throttled.

A code the view declares itself keeps the view's description; where it declares one without a body, the
body is the error's.
"""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import permissions, serializers
from rest_framework.generics import GenericAPIView

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class ErrorSerializer(serializers.Serializer):
    detail = serializers.CharField(help_text=_("What was wrong, in the reader's language."))

    class Meta:
        ref_name = "Error"


class ValidationErrorSerializer(serializers.Serializer):
    """`{"detail": ...}` for a body that does not parse; otherwise the fields at fault, each with its
    messages (a list of items has one object of messages per item)."""

    detail = serializers.CharField(required=False)
    non_field_errors = serializers.ListField(child=serializers.CharField(), required=False)

    class Meta:
        ref_name = "ValidationError"


class PortalAutoSchema(AutoSchema):
    def _refusals(self) -> dict[str, OpenApiResponse]:
        method = self.method.upper()
        parameters = self._get_parameters()
        in_path = any(p.get("in") == "path" for p in parameters)
        in_query = any(p.get("in") == "query" for p in parameters)
        checks_permissions = [
            p
            for p in self.view.get_permissions()
            if not isinstance(p, (permissions.AllowAny, permissions.IsAuthenticated))
        ]
        needs_login = any(not isinstance(p, permissions.AllowAny) for p in self.view.get_permissions())
        error = ErrorSerializer
        refusals = {}
        if in_query or (method in UNSAFE_METHODS and self.get_request_serializer() is not None):
            refusals["400"] = OpenApiResponse(ValidationErrorSerializer, _("The input is not valid."))
        if self.view.get_authenticators():
            refusals["401"] = OpenApiResponse(error, _("No valid token was sent."))
        if needs_login and (method in UNSAFE_METHODS or checks_permissions):
            refusals["403"] = OpenApiResponse(error, _("Your role does not allow this."))
        if in_path:
            refusals["404"] = OpenApiResponse(error, _("No such object, or not yours to see."))
        if method in UNSAFE_METHODS and isinstance(self.view, GenericAPIView):
            refusals["409"] = OpenApiResponse(error, _("It clashes with the object's current state."))
        if self.view.get_throttles():
            refusals["429"] = OpenApiResponse(error, _("Too many attempts: wait a little."))
        return refusals

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        refusals = self._refusals()
        # A refusal the view declares without a body (`OpenApiResponse()`) gets the error's body too.
        for code in [code for code in responses if code.startswith("4")]:
            if "content" not in responses[code]:
                serializer = ValidationErrorSerializer if code == "400" else ErrorSerializer
                refusals.setdefault(code, OpenApiResponse(serializer))
        for code, refusal in refusals.items():
            if code not in responses or "content" not in responses[code]:
                described = responses.get(code, {}).get("description")
                # Refusals answer JSON whatever the view renders on success (a file, say).
                responses[code] = self._get_response_for_code(
                    refusal, code, media_types=["application/json"], direction=direction
                )
                if described:
                    responses[code]["description"] = described
        return responses
