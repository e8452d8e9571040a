"""Node agents' tokens: issue one for a cluster, find the live token behind a key, revoke, note its use.

- key: the secret an agent sends as `Authorization: Bearer <key>`: 256 random bits, shown once when
  issued and never stored. Random keys need no slow hash; the portal keeps the SHA-256 (`digest`) and
  the first characters (`prefix`), so a person can tell their tokens apart.
- live: not revoked. A web process keeps a copy of every live token, read all at once when it first
  needs one it does not hold (monitoring.ingest.copies); a revocation reaches every process through the
  broker at once. A token speaks for its cluster only: the readings it brings are stored as that
  cluster's hosts', whatever the batch says.
- use: when a token was last used and the host whose readings it last brought, written at most once per
  USE_RECORDED_EVERY, so that an agent posting every 15 s (or many agents sharing one token) costs no write
  per batch.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

import redis
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from monitoring.conf import settings
from monitoring.ingest import broker, copies
from monitoring.models import AgentToken
from monitoring.storage.statements import bound
from pools.models import Cluster
from portal.errors import InvalidInput
from portal.tokens import KEY_BYTES, PREFIX_LENGTH, USE_RECORDED_EVERY, digest, record_use

log = logging.getLogger(__name__)


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
    """Stop a token working at once, in every process (see _tell_revoked); revoking twice keeps the first
    time."""
    with transaction.atomic():
        token = AgentToken.objects.select_for_update().get(pk=token.pk)
        if token.revoked_at is None:
            token.revoked_at = timezone.now()
            token.save(update_fields=["revoked_at"])
            copies.forget(_COPIES, token.digest)
            transaction.on_commit(functools.partial(_tell_revoked, token.pk, token.revoked_at))
    return token


def _tell_revoked(pk: int, at: datetime) -> None:
    """Tell every process that token `pk` was revoked `at`: the broker keeps its id for as long as a
    process's copy of the token may live (the call that leaves a batch for the writer looks there). Should
    the broker not answer, copies still end within MONITORING_AGENT_COPY_SECONDS, and the writer stores
    nothing a token brought once revoked."""
    client, key = broker.client(), broker.revoked_tokens_key()
    try:
        client.zadd(key, {str(pk): at.timestamp()})
        client.zremrangebyscore(key, "-inf", time.time() - settings.MONITORING_AGENT_COPY_SECONDS - _SLACK)
    except (redis.RedisError, OSError):
        log.exception("Could not tell the broker that agent token %s was revoked", pk)


_COPIES = "agent-token"  # this process's copies of live tokens, by their key's digest
_SLACK = 60  # seconds a revocation is kept past the longest life of a copy, for clocks that differ
_TOKEN_FIELDS = ("id", "cluster_id", "digest", "last_used_at", "last_host")  # the model's order, for from_db
_TOKEN_SQL = (
    f"SELECT t.id, t.cluster_id, t.last_used_at, t.last_host, c.name FROM {AgentToken._meta.db_table} t "
    f"JOIN {Cluster._meta.db_table} c ON c.id = t.cluster_id WHERE t.digest = %s AND t.revoked_at IS NULL"
)


_LIVE_TOKENS_SQL = (
    "SELECT t.id, t.cluster_id, t.last_used_at, t.last_host, c.name, t.digest "
    f"FROM {AgentToken._meta.db_table} t JOIN {Cluster._meta.db_table} c ON c.id = t.cluster_id "
    "WHERE t.revoked_at IS NULL "
    "ORDER BY t.last_used_at DESC NULLS LAST, t.id DESC LIMIT %s"
)


def find_agent_token(key: str) -> AgentToken | None:
    """The live token behind `key`, with its cluster (its name only): this process's copy of it
    (monitoring.ingest.copies), else read in one query (with every live token, where this process has not
    read them within a copy's life); writes nothing. A copy may outlive a revocation
    in another process: the batch it brings is refused when it is left for the writer."""
    if not key:
        return None
    key_digest = digest(key)
    token = copies.get(_COPIES, key_digest)
    if token is not None:
        return token
    if copies.read_all(_COPIES, "live", _copy_live_tokens):
        token = copies.get(_COPIES, key_digest)
        if token is not None:
            return token
    with bound(prepared=True) as cursor:
        cursor.execute(_TOKEN_SQL, [key_digest])
        row = cursor.fetchone()
    if row is None:
        return None
    token = _token(*row, key_digest, {})
    copies.keep(_COPIES, key_digest, token)
    return token


def _copy_live_tokens() -> None:
    """Keep a copy of every live token (the most lately used first, as many as copies hold), once a copy's
    life (copies.read_all). A web process starts with no copies, and every agent of a fleet posts within
    15 s: one query then spares each of them a query of its own, the dearest part of the first batch a
    process takes from it."""
    clusters: dict[int, Cluster] = {}
    with bound(prepared=True) as cursor:
        cursor.execute(_LIVE_TOKENS_SQL, [settings.MONITORING_AGENT_COPIES])
        rows = cursor.fetchall()
    copies.keep_all(_COPIES, ((row[-1], _token(*row, clusters)) for row in rows))


def _token(token_id, cluster_id, last_used_at, last_host, cluster, key_digest, clusters) -> AgentToken:
    """A token as the queries above read it, with its cluster (its name only; one object a cluster)."""
    token = AgentToken.from_db(
        DEFAULT_DB_ALIAS, _TOKEN_FIELDS, (token_id, cluster_id, key_digest, last_used_at, last_host)
    )
    if cluster_id not in clusters:
        clusters[cluster_id] = Cluster.from_db(DEFAULT_DB_ALIAS, ("id", "name"), (cluster_id, cluster))
    token.cluster = clusters[cluster_id]
    return token


def forget_agent_token(token: AgentToken) -> None:
    """Drop this process's copy of `token` (found revoked)."""
    copies.forget(_COPIES, token.digest)


def agent_token_for_key(key: str) -> AgentToken | None:
    """The live token behind `key`, with its cluster, or None; notes that it was used."""
    token = find_agent_token(key)
    if token is not None:
        record_use(token)  # an agent posting every 15 s costs no write each time
    return token


_USES_SQL = (
    f"UPDATE {AgentToken._meta.db_table} t SET last_used_at = v.at, last_host = v.host "
    "FROM unnest(%s::bigint[], %s::timestamptz[], %s::text[]) v(id, at, host) "
    "WHERE t.id = v.id AND (t.last_used_at IS NULL OR t.last_used_at <= v.at - %s OR t.last_host = '')"
)


def record_agent_hosts(uses: dict[int, tuple[datetime, str]]) -> None:
    """Note for each token id in `uses` when it brought readings and of which host, in one statement for all:
    written once USE_RECORDED_EVERY has passed since the last note, or at once for a token that has no host
    yet. A token shared by many agents thus names one of them, the last noted."""
    if not uses:
        return
    width = AgentToken._meta.get_field("last_host").max_length
    ids = sorted(uses)  # one order of locks for every writer
    with bound(prepared=False) as cursor:
        cursor.execute(
            _USES_SQL,
            [ids, [uses[pk][0] for pk in ids], [uses[pk][1][:width] for pk in ids], USE_RECORDED_EVERY],
        )
