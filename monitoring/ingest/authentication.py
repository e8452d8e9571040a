"""How the samples endpoint knows which agent calls: `Authorization: Bearer <key>`, an agent token's key.

Only this scheme opens the endpoint: no session, no person's API token. The request's `auth` is the
AgentToken (its cluster is the one the readings belong to) and its `user` is anonymous. The endpoint's own
path (monitoring.ingest.api) reads the header with `agent_key` and answers with the same messages.
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from monitoring.ingest import tokens
from monitoring.models import AgentToken

KEYWORD = "Bearer"
NOT_VALID_OR_REVOKED = _("This agent token is not valid or was revoked.")


def agent_key(request) -> str | None:
    """The key of the request's `Authorization: Bearer <key>` header (any Django or framework request), or
    None when it names no such scheme; AuthenticationFailed when the header is malformed."""
    parts = authentication.get_authorization_header(request).split()
    if not parts or parts[0].lower() != KEYWORD.lower().encode():
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed(_("Send the header as: Authorization: Bearer <key>."))
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError as error:
        raise exceptions.AuthenticationFailed(_("This agent token is not valid.")) from error


class AgentTokenAuthentication(authentication.BaseAuthentication):
    keyword = KEYWORD

    def authenticate(self, request):
        key = agent_key(request)
        if key is None:
            return None  # no agent token: the permission below answers 401
        token = tokens.agent_token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed(NOT_VALID_OR_REVOKED)
        return AnonymousUser(), token

    def authenticate_header(self, request) -> str:
        return self.keyword  # a missing or bad token is a 401 that names the scheme


class FromAgent(permissions.BasePermission):
    """The caller is a node agent holding a live token."""

    message = _("Send a node agent's token as: Authorization: Bearer <key>.")

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, AgentToken)


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes the agent's header."""

    target_class = "monitoring.ingest.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A node agent's key: made in the admin (agent tokens), shown once.",
        }
