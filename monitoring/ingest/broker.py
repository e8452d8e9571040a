"""The broker's Redis as ingest uses it beside Celery: the agents' batches waiting for the writer
(monitoring.ingest.accepted) and the agent tokens revoked lately (monitoring.ingest.tokens).

Each key names this database, so that portals (or test runs) sharing a Redis keep apart.
"""

from __future__ import annotations

import functools
import os

import redis

from monitoring.conf import settings

LONGEST_WAIT = 10  # seconds a call waits in Redis for something to come, at most (the writer's linger)


@functools.cache
def client() -> redis.Redis:
    """The broker's Redis (each process its own connections: redis-py opens new ones after a fork)."""
    return redis.Redis.from_url(
        settings.CELERY_BROKER_URL, socket_timeout=3 * LONGEST_WAIT, socket_connect_timeout=5
    )


def own_connection() -> redis.Redis:
    """The broker's Redis on one connection that this process keeps for itself, for the short calls a
    request makes (an agent's batch left for the writer): a call on it takes no connection from a pool and
    checks none for stale answers, a third of redis-py's time for such a call. The process's threads take
    turns on it; a process forked from this one makes its own. A call that waits in Redis (the writer's)
    belongs on client()."""
    return _own_connection(os.getpid())


@functools.cache
def _own_connection(pid: int) -> redis.Redis:
    return redis.Redis.from_url(
        settings.CELERY_BROKER_URL, socket_timeout=5, socket_connect_timeout=5, single_connection_client=True
    )


def key(name: str) -> str:
    """The key of `name` for this database."""
    return f"monitoring:{name}:{settings.DATABASES['default']['NAME']}"


def revoked_tokens_key() -> str:
    """A sorted set of the ids of agent tokens revoked lately, scored with when (Unix seconds)."""
    return key("revoked-agent-tokens")
