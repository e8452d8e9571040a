"""What the portal refuses to start with, checked while its settings load (portal/settings.py), so that every
process (web, worker, beat, every manage.py command) stops before it serves or runs anything:

- a secret still holding the placeholder of the shipped examples (deploy/kubernetes/secret.yaml,
  .env.example): a secret whose value, or an address whose user or password, starts with `change-me`;
- an empty METRICS_TOKEN while a proxy is trusted (TRUSTED_PROXY_COUNT > 0): behind a proxy every client
  seems to come from the proxy's network, so /metrics answers nothing but the token (portal/metrics.py).

Each refusal names the setting and says what to set; none repeats a secret's value.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

PLACEHOLDER = "change-me"
# Settings that are secrets themselves, and settings that are addresses which may carry a password.
SECRETS = ("SECRET_KEY", "CLUSTER_SECRETS_KEY", "METRICS_TOKEN")
ADDRESSES = ("DATABASE_URL", "REDIS_URL", "CACHE_URL", "EMAIL_URL")
MAKE_ONE = "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`"


def is_placeholder(value: str) -> bool:
    return value.strip().lower().startswith(PLACEHOLDER)


def _credentials(address: str) -> tuple[str, str]:
    try:
        parts = urlsplit(address)
        return unquote(parts.username or ""), unquote(parts.password or "")
    except ValueError:  # not an address at all: the setting's own parser says so
        return "", ""


def refuse_placeholders(values: Mapping[str, str]) -> None:
    """Raises ImproperlyConfigured naming the first of SECRETS and ADDRESSES in `values` that still holds
    the shipped placeholder."""
    for name in SECRETS:
        if is_placeholder(values.get(name, "")):
            raise ImproperlyConfigured(
                f'{name} still holds the placeholder of the shipped examples ("{PLACEHOLDER}…"): the portal '
                f"refuses to start with it. Set {name} to a long random string of your own, e.g. the output "
                f"of {MAKE_ONE}."
            )
    for name in ADDRESSES:
        if any(is_placeholder(part) for part in _credentials(values.get(name, ""))):
            raise ImproperlyConfigured(
                f"The user or password in {name} is still the placeholder of the shipped examples "
                f'("{PLACEHOLDER}…"): the portal refuses to start with it. Put the real user and password in '
                f"{name}."
            )


def refuse_open_metrics(*, token: str, trusted_proxies: int) -> None:
    """Raises ImproperlyConfigured when a proxy is trusted and no METRICS_TOKEN is set: /metrics would be
    closed to everyone, Prometheus included, or (were addresses believed) open to everyone."""
    if trusted_proxies > 0 and not token.strip():
        raise ImproperlyConfigured(
            f"METRICS_TOKEN is empty while TRUSTED_PROXY_COUNT is {trusted_proxies}: behind a proxy every "
            "client seems to come from the proxy's network, so /metrics answers only `Authorization: Bearer "
            f"<METRICS_TOKEN>` and the portal refuses to start without one. Set METRICS_TOKEN to a long "
            f"random string, e.g. the output of {MAKE_ONE}, and give Prometheus the same."
        )
