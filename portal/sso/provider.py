"""The OpenID Connect provider of the portal: allauth's, with every check of the ID token made.

allauth skips the signature of an ID token it fetched itself (allowed over TLS by the specification) and sends
no nonce. Here the token is always checked against the provider's published keys, its issuer must be the one
configured (and the discovery document must name that same issuer), its audience this client, it must not
have expired, and it must carry the nonce this sign-in sent (checked in `adapter.py`, where the sign-in's
state is at hand). The sign-in's state is allauth's: kept in the session and dropped once used, so a replayed
callback finds none.
"""

from __future__ import annotations

import secrets

import jwt
import requests
from allauth.socialaccount.adapter import get_adapter
from allauth.socialaccount.helpers import render_authentication_error
from allauth.socialaccount.internal import jwtkit
from allauth.socialaccount.models import SocialApp
from allauth.socialaccount.providers.oauth2.client import OAuth2Error
from allauth.socialaccount.providers.oauth2.views import OAuth2CallbackView, OAuth2LoginView
from allauth.socialaccount.providers.openid_connect.provider import OpenIDConnectProvider
from allauth.socialaccount.providers.openid_connect.views import OpenIDConnectOAuth2Adapter
from django.http import Http404, HttpRequest

from portal.sso import errors
from portal.sso.errors import SignInRefused

NONCE = "nonce"
# Public-key signatures: a token "signed" with a shared secret or with none is refused.
SIGNING_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512"}
)
ID_TOKEN = "id_token"  # where the raw ID token rides on a sign-in until it is kept in the session

__all__ = ["Adapter", "Provider", "callback", "login"]


def _refusal(error: jwt.PyJWTError) -> SignInRefused:
    if isinstance(error, jwt.InvalidIssuerError):
        return SignInRefused(errors.WRONG_ISSUER)
    if isinstance(error, jwt.InvalidAudienceError):
        return SignInRefused(errors.WRONG_AUDIENCE)
    if isinstance(error, jwt.ExpiredSignatureError):
        return SignInRefused(errors.EXPIRED)
    if isinstance(error, jwt.InvalidSignatureError):
        return SignInRefused(errors.BAD_SIGNATURE)
    return SignInRefused(errors.BAD_TOKEN)


class Adapter(OpenIDConnectOAuth2Adapter):
    @property
    def openid_config(self) -> dict:
        config = super().openid_config
        issuer = self.get_provider().issuer
        if str(config.get("issuer", "")).rstrip("/") != issuer:
            raise SignInRefused(errors.WRONG_ISSUER)
        return config

    def complete_login(self, request: HttpRequest, app, token, **kwargs):
        login = super().complete_login(request, app, token, **kwargs)
        raw = kwargs["response"].get("id_token")
        if not raw:
            raise SignInRefused(errors.BAD_TOKEN)
        setattr(login, ID_TOKEN, raw)
        return login

    def _decode_id_token(self, app: SocialApp, id_token: str) -> dict:
        config = (
            self.openid_config
        )  # its issuer is the configured one (checked above), as the provider writes it
        try:
            alg, key = jwtkit.fetch_key(id_token, config["jwks_uri"], jwtkit.lookup_kid_jwk)
            if alg not in SIGNING_ALGORITHMS:  # only the provider's public keys may vouch for a token
                raise SignInRefused(errors.BAD_SIGNATURE)
            data = jwt.decode(
                id_token,
                key=key,
                algorithms=[alg],
                issuer=config["issuer"],
                audience=app.client_id,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.PyJWTError as error:
            raise _refusal(error) from error
        except (KeyError, ValueError) as error:  # a header without kid or alg, or keys that cannot be read
            raise SignInRefused(errors.BAD_TOKEN) from error
        try:
            jwtkit.verify_jti(data)
        except OAuth2Error as error:
            raise SignInRefused(errors.REPLAYED) from error
        return data


class Provider(OpenIDConnectProvider):
    oauth2_adapter_class = Adapter
    package = "allauth.socialaccount.providers.openid_connect"  # its addresses are allauth's (urls.py)

    @property
    def issuer(self) -> str:
        return str(self.app.settings.get("issuer") or self.app.settings["server_url"]).rstrip("/")

    @property
    def groups_claim(self) -> str:
        return self.app.settings.get("groups_claim") or "groups"

    @property
    def mfa_acr(self) -> list[str]:
        return list(self.app.settings.get("mfa_acr") or [])

    def redirect(self, request: HttpRequest, process, next_url=None, data=None, **kwargs):
        """To the provider, with a fresh nonce that the ID token must carry back (kept in the state)."""
        nonce = secrets.token_urlsafe(32)
        auth_params = kwargs.pop("auth_params", None)
        auth_params = {**(self.get_auth_params() if auth_params is None else auth_params), NONCE: nonce}
        return super().redirect(
            request, process, next_url, data, auth_params=auth_params, nonce=nonce, **kwargs
        )


def login(request: HttpRequest, provider_id: str):
    try:
        return OAuth2LoginView.adapter_view(Adapter(request, provider_id))(request)
    except SocialApp.DoesNotExist:
        raise Http404 from None
    except (requests.RequestException, ValueError):  # discovery unreachable, or not JSON
        provider = get_adapter().get_provider(request, provider_id)
        return render_authentication_error(request, provider, exception=SignInRefused(errors.UNREACHABLE))


def callback(request: HttpRequest, provider_id: str):
    try:
        return OAuth2CallbackView.adapter_view(Adapter(request, provider_id))(request)
    except SocialApp.DoesNotExist:
        raise Http404 from None
