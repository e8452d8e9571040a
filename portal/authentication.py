"""How the API knows who calls: `Authorization: Token <key>`, checked against the live tokens."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from portal import tokens


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        parts = authentication.get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None  # another scheme, or none: the next authenticator may know it
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(_("Send the header as: Authorization: Token <key>."))
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError as error:
            raise exceptions.AuthenticationFailed(_("This token is not valid.")) from error
        token = tokens.token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("This token is not valid, has expired or was revoked."))
        return token.user, token

    def authenticate_header(self, request) -> str:
        return self.keyword  # makes a missing or bad token a 401, not a 403


class TokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema describes the token header."""

    target_class = "portal.authentication.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'A key from POST /api/v1/auth/token/, sent as "Token <key>".',
        }
