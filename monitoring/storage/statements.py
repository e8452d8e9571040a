"""Cursors that bind parameters on the server, for the few statements a node agent's batch runs every time
(its token, its hosts' GPUs, its samples' newest figures), and that keep the plans of those that cannot go
wrong.

Django's cursors bind parameters on the client (psycopg's ClientCursor), so the server parses and plans each
statement anew. A `bound` cursor sends them apart; with `prepared`, psycopg also prepares each statement the
first time a connection runs it (a connection lives CONN_MAX_AGE), and the server keeps its plan. Only a
statement whose plan stays right as tables grow is prepared: a lookup by a unique key, an upsert. A query
whose best plan depends on how big a table is now (reading the hosts' newest figures) is planned at each
run: a plan kept from when the table was small would scan it whole once it is not. Otherwise a bound cursor
is one of Django's: the same connection and transaction, its errors Django's, its queries logged and counted
as Django's (its timestamps read faster: see _TIMESTAMPTZ). A statement run through it names its columns
(no `SELECT *`), so that a migration cannot change the rows a prepared statement returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection
from django.db.backends.postgresql.base import CursorDebugWrapper, ServerBindingCursor

# Django reads timestamps through a loader of its own written in Python, which costs tens of microseconds
# a value, more than the rest of a row: a bound cursor reads them with the driver's own (compiled where
# psycopg has its C speed-ups), in the connection's time zone, which Django sets (UTC unless told).
_TIMESTAMPTZ = psycopg.postgres.adapters.get_loader(
    psycopg.postgres.types["timestamptz"].oid, psycopg.pq.Format.TEXT
)


class _Logged(CursorDebugWrapper):
    """Logs a statement as written, with its parameters apart: the driver keeps no text of a prepared
    statement's run for Django to log."""

    def debug_sql(self, sql=None, params=None, use_last_executed_query=False, many=False):
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


@contextmanager
def bound(*, prepared: bool) -> Iterator:
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    raw = connection.connection
    # psycopg prepares a server-bound statement after this many runs (None: never); Django's client-side
    # cursors never prepare, whatever it says.
    raw.prepare_threshold = 0 if prepared else None
    with connection.wrap_database_errors:
        cursor = ServerBindingCursor(raw)
    cursor.adapters.register_loader("timestamptz", _TIMESTAMPTZ)
    wrapped = _Logged(cursor, connection) if connection.queries_logged else connection.make_cursor(cursor)
    with wrapped:
        yield wrapped
