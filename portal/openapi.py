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

What the server refuses in every request is said where it applies, so that a request the schema allows is
one the server takes: no string a request carries (path, query or body) may hold a NUL character
(`portal.middleware`, `portal.parsers`), so each string a request carries has a pattern that excludes it;
a query value is at most `MAX_QUERY_VALUE_LENGTH` long; a list has the bounds its serializer enforces.
"""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import permissions, serializers
from rest_framework.generics import GenericAPIView

from portal.middleware import MAX_QUERY_VALUE_LENGTH

UNSAFE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
NO_NUL_PATTERN = "^[^\\u0000]*$"  # ECMA escape: any string without a NUL character


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
    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        # drf-spectacular leaves out the bounds of a nested list (`many=True`): say what the server enforces.
        if isinstance(field, serializers.ListSerializer | serializers.ListField) and schema:
            if not field.allow_empty:
                schema["minItems"] = max(schema.get("minItems", 0), 1)
            if field.min_length is not None:
                schema["minItems"] = max(schema.get("minItems", 0), field.min_length)
            if field.max_length is not None:
                schema["maxItems"] = min(schema.get("maxItems", field.max_length), field.max_length)
        return schema

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


def _refuse_nul(schema, components: dict, seen: set[str]) -> None:
    """Give every free string of `schema` (and of the components it refers to) the pattern without NUL."""
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            _refuse_nul(components.get(name), components, seen)
        return
    kinds = schema.get("type")
    is_string = "string" in (kinds if isinstance(kinds, list) else [kinds])
    # An enum, a pattern or a format (date, e-mail, ...) already leaves NUL out.
    if is_string and not {"enum", "pattern", "format"} & set(schema):
        schema["pattern"] = NO_NUL_PATTERN
    children = [
        *schema.get("properties", {}).values(),
        schema.get("items"),
        schema.get("additionalProperties"),
    ]
    for key in ("allOf", "anyOf", "oneOf"):
        children += schema.get(key, [])
    for child in children:
        _refuse_nul(child, components, seen)


def requests_as_enforced(result: dict, generator, request, public) -> dict:
    """drf-spectacular postprocessing hook: what the server refuses in any request, said on every string a
    request carries — no NUL character, and no query value longer than MAX_QUERY_VALUE_LENGTH."""
    components = result.get("components", {}).get("schemas", {})
    seen: set[str] = set()
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                _refuse_nul(schema, components, seen)
                if parameter.get("in") == "query" and schema.get("type") == "string":
                    schema["maxLength"] = min(
                        schema.get("maxLength", MAX_QUERY_VALUE_LENGTH), MAX_QUERY_VALUE_LENGTH
                    )
            for content in operation.get("requestBody", {}).get("content", {}).values():
                _refuse_nul(content.get("schema"), components, seen)
    return result
