"""Node agents' tokens: issue one for a cluster, find the live token behind a key, revoke, note its use.

- key: the secret an agent sends as `Authorization: Bearer <key>`: 256 random bits, shown once when
  issued and never stored. Random keys need no slow hash; the portal keeps the SHA-256 (`digest`) and
  the first characters (`prefix`), so a person can tell their tokens apart.
- live: not revoked. A token speaks for its cluster only: the readings it brings are stored as that
  cluster's hosts', whatever the batch says.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from monitoring.models import AgentToken
from pools.models import Cluster
from portal.errors import InvalidInput
from portal.tokens import KEY_BYTES, PREFIX_LENGTH, digest, record_use


@dataclass(frozen=True)
class IssuedAgentToken:
    token: AgentToken
    key: str


def issue_agent_token(
    *, cluster: Cluster, name: str, created_by: AbstractBaseUser | None = None
) -> IssuedAgentToken:
    """A new token for the agents of `cluster`; the key in the answer is the only copy there will be."""
    name = name.strip()
    if not name:
        raise InvalidInput(_("Give the token a name, e.g. the node its agent runs on."), field="name")
    if len(name) > AgentToken._meta.get_field("name").max_length:
        raise InvalidInput(_("A token name has at most 100 characters."), field="name")
    try:
        AgentToken._meta.get_field("name").run_validators(name)
    except ValidationError as error:
        raise InvalidInput(" ".join(error.messages), field="name") from error
    key = secrets.token_urlsafe(KEY_BYTES)
    token = AgentToken.objects.create(
        cluster=cluster,
        name=name,
        prefix=key[:PREFIX_LENGTH],
        digest=digest(key),
        created_by=created_by,
    )
    return IssuedAgentToken(token=token, key=key)


def revoke_agent_token(*, token: AgentToken) -> AgentToken:
    """Stop a token working at once; revoking twice keeps the first time."""
    with transaction.atomic():
        token = AgentToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
    return token


def agent_token_for_key(key: str) -> AgentToken | None:
    """The live token behind `key`, with its cluster, or None; notes that it was used."""
    if not key:
        return None
    token = AgentToken.objects.select_related("cluster").filter(digest=digest(key)).first()
    if token is None or token.revoked_at is not None:
        return None
    record_use(token)  # an agent posting every 15 s costs no write each time
    return token


def record_agent_host(*, token: AgentToken, host: str) -> None:
    """Remember the host whose readings the token last brought (written only when it changes)."""
    host = host[: AgentToken._meta.get_field("last_host").max_length]
    if host and host != token.last_host:
        AgentToken.objects.filter(pk=token.pk).update(last_host=host)
        token.last_host = host
