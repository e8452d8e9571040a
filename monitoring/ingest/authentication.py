"""How the samples endpoint knows which agent calls: `Authorization: Bearer <key>`, an agent token's key.

Only this scheme opens the endpoint: no session, no person's API token. The request's `auth` is the
AgentToken (its cluster is the one the readings belong to) and its `user` is anonymous.
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from monitoring.ingest import tokens
from monitoring.models import AgentToken


class AgentTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None  # no agent token: the permission below answers 401
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(_("Send the header as: Authorization: Bearer <key>."))
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError as error:
            raise exceptions.AuthenticationFailed(_("This agent token is not valid.")) from error
        token = tokens.agent_token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("This agent token is not valid or was revoked."))
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
