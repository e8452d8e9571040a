"""The identity providers, read from the environment for `portal/settings.py`: plain data, no Django.

`OIDC_ISSUER`, `OIDC_CLIENT_ID` and `OIDC_CLIENT_SECRET` configure one provider, with the id `oidc`; more come
as a JSON list in `OIDC_PROVIDERS`, each `{"id", "name", "issuer", "client_id", "client_secret"}` and
optionally `"groups_claim"`, `"mfa_acr"` (a list) and `"scopes"` (a list). The one of `OIDC_ISSUER` takes its
options from `OIDC_NAME`, `OIDC_GROUPS_CLAIM`, `OIDC_MFA_ACR` and `OIDC_SCOPES` (space or comma separated).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

DEFAULT_ID = "oidc"
DEFAULT_NAME = "Single sign-on"
DEFAULT_GROUPS_CLAIM = "groups"
DEFAULT_SCOPES = ("openid", "profile", "email")
PROVIDER_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")


class ProviderConfigError(ValueError):
    """The environment names a provider that cannot be used; the message says what to set."""


def _words(value: str | list | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(word) for word in value if str(word).strip()]
    return [word for word in re.split(r"[\s,]+", value) if word]


def _app(entry: Mapping) -> dict:
    """One provider as allauth's OpenID Connect provider takes it (a `SOCIALACCOUNT_PROVIDERS` app)."""
    missing = [key for key in ("id", "issuer", "client_id", "client_secret") if not entry.get(key)]
    if missing:
        raise ProviderConfigError(
            f"The identity provider {entry.get('id') or entry.get('issuer') or '?'} needs "
            f"{', '.join(missing)}."
        )
    provider_id = str(entry["id"])
    if not PROVIDER_ID.match(provider_id):
        raise ProviderConfigError(
            f"The identity provider id {provider_id!r} must be lower-case letters, digits, - and _."
        )
    issuer = str(entry["issuer"]).rstrip("/")
    if not issuer.startswith(("https://", "http://")):
        raise ProviderConfigError(f"The issuer of {provider_id} must be an http(s) address, not {issuer!r}.")
    scopes = _words(entry.get("scopes")) or list(DEFAULT_SCOPES)
    if "openid" not in scopes:
        scopes.insert(0, "openid")
    return {
        "provider_id": provider_id,
        "name": str(entry.get("name") or DEFAULT_NAME),
        "client_id": str(entry["client_id"]),
        "secret": str(entry["client_secret"]),
        "settings": {
            "server_url": issuer,
            "issuer": issuer,
            "scope": scopes,
            "groups_claim": str(entry.get("groups_claim") or DEFAULT_GROUPS_CLAIM),
            "mfa_acr": _words(entry.get("mfa_acr")),
            "fetch_userinfo": False,
        },
    }


def provider_apps(environ: Mapping[str, str]) -> list[dict]:
    """The configured providers, in order: the one of `OIDC_ISSUER` first, then `OIDC_PROVIDERS`'. Raises
    ProviderConfigError naming what is wrong."""
    entries: list[Mapping] = []
    if environ.get("OIDC_ISSUER"):
        entries.append(
            {
                "id": DEFAULT_ID,
                "name": environ.get("OIDC_NAME") or DEFAULT_NAME,
                "issuer": environ.get("OIDC_ISSUER"),
                "client_id": environ.get("OIDC_CLIENT_ID"),
                "client_secret": environ.get("OIDC_CLIENT_SECRET"),
                "groups_claim": environ.get("OIDC_GROUPS_CLAIM"),
                "mfa_acr": environ.get("OIDC_MFA_ACR"),
                "scopes": environ.get("OIDC_SCOPES"),
            }
        )
    more = environ.get("OIDC_PROVIDERS", "").strip()
    if more:
        try:
            listed = json.loads(more)
        except json.JSONDecodeError as error:
            raise ProviderConfigError(f"OIDC_PROVIDERS is not JSON: {error}.") from None
        if not isinstance(listed, list) or not all(isinstance(entry, dict) for entry in listed):
            raise ProviderConfigError("OIDC_PROVIDERS must be a JSON list of objects.")
        entries.extend(listed)
    apps = [_app(entry) for entry in entries]
    ids = [app["provider_id"] for app in apps]
    if len(set(ids)) != len(ids):
        raise ProviderConfigError(f"Two identity providers have the same id: {', '.join(ids)}.")
    return apps


def provider_origins(apps: list[dict]) -> list[str]:
    """The origins of the providers' issuers: where the sign-in and sign-out forms' redirects go, which the
    portal's content security policy must allow as form targets."""
    found: dict[str, None] = {}
    for app in apps:
        scheme, _sep, rest = app["settings"]["issuer"].partition("://")
        found[f"{scheme}://{rest.split('/', 1)[0]}"] = None
    return list(found)
