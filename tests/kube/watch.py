"""Watches of the test API server: `?watch=true` on a list path, answered as a real server answers it with a
stream of newline-delimited events (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR) over chunked HTTP.

Words used here (as the Kubernetes API's documentation of watches uses them):
- event: `{"type": ..., "object": ...}` on one line; the object is the changed object, or for DELETED the
  object as it was, at the version of its removal. An object that stops passing the watch's selectors is
  DELETED for it, one that starts passing them ADDED, as a real server's watch cache sends them;
- from a version: `resourceVersion=N` sends every change after N from the kind's history, then the changes
  as they come; none, or "0", first sends the objects there are now as ADDED;
- bookmark: with `allowWatchBookmarks=true`, an event whose object carries nothing but a resourceVersion:
  every change up to it has been sent. This server sends one once it has sent what was waiting, one every
  `bookmark_seconds` after that, and one as it ends the watch at its `timeoutSeconds`;
- expired: a version older than what the kind's history keeps (store.py), answered with one ERROR event
  carrying a Status of code 410 and reason Expired, after which the watch ends;
- dropped: a watch a test ended without a word (`KubeApiServer.drop_watches`), as a broken connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from tests.kube.semantics import ApiError, field_matcher, label_matcher, status_body
from tests.kube.store import Change, ClusterStore, Resource

WAKE_SECONDS = 0.2  # how often an idle watch looks whether its client left or a test dropped it
DEFAULT_TIMEOUT = 1800  # a real server's shortest request timeout, for a watch that names none
BOOKMARK_SECONDS = 10.0


class Dropped(Exception):
    """A test dropped the watch, or the server stopped: its connection is to be cut."""


def _flag(query: dict[str, str], name: str) -> bool:
    return query.get(name) in ("true", "1")


def _number(query: dict[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer, not {raw!r}") from None
    if value < 0:
        raise ApiError(400, f"{name} must not be negative")
    return value


class Watch:
    """One open watch of one kind (in one namespace, or all), with the list's selectors."""

    def __init__(
        self,
        store: ClusterStore,
        resource: Resource,
        namespace: str | None,
        query: dict[str, str],
        *,
        bookmark_seconds: float,
    ) -> None:
        self.store = store
        self.resource = resource
        self.namespace = namespace
        self._labels = label_matcher(query.get("labelSelector"))
        self._fields = field_matcher(resource.kind, query.get("fieldSelector"))
        raw_version = query.get("resourceVersion") or "0"
        try:
            self.since = int(raw_version)
        except ValueError:
            raise ApiError(400, f"invalid resource version: {raw_version!r}") from None
        self.timeout = _number(query, "timeoutSeconds") or DEFAULT_TIMEOUT
        self.bookmarks = _flag(query, "allowWatchBookmarks")
        self.bookmark_seconds = bookmark_seconds
        self._dropped = threading.Event()

    def drop(self) -> None:
        self._dropped.set()

    def lines(self, client_gone: Callable[[], bool]) -> Iterator[bytes]:
        """The watch's events, one encoded line each, until its timeout; raises Dropped when a test drops it,
        and ends quietly when its client leaves."""
        deadline = time.monotonic() + self.timeout
        with self.store.lock:
            if self.since:
                changes = self.store.changes_since(self.resource.kind, self.since)
                if changes is None:
                    yield self._line(self._expired(self.since))
                    return
                events = [event for event in map(self._event, changes) if event]
            else:
                events = self._current()
            position = self.store.resource_version
        for event in events:
            yield self._line(event)
        if self.bookmarks:
            yield self._line(self._bookmark(position))
        next_bookmark = time.monotonic() + self.bookmark_seconds
        while True:
            with self.store.lock:
                while self.store.resource_version == position:
                    now = time.monotonic()
                    if self._dropped.is_set():
                        raise Dropped
                    if now >= deadline or (self.bookmarks and now >= next_bookmark) or client_gone():
                        break
                    self.store.changed.wait(min(WAKE_SECONDS, deadline - now))
                if self._dropped.is_set():
                    raise Dropped
                changes = self.store.changes_since(self.resource.kind, position)
                if changes is None:  # the history moved past what this watch had yet to send
                    expired = self._expired(position)
                else:
                    expired = None
                    events = [event for event in map(self._event, changes) if event]
                    position = self.store.resource_version
            if expired is not None:
                yield self._line(expired)
                return
            for event in events:
                yield self._line(event)
            now = time.monotonic()
            if now >= deadline:
                if self.bookmarks:
                    yield self._line(self._bookmark(position))
                return
            if client_gone():
                return
            if self.bookmarks and now >= next_bookmark:
                yield self._line(self._bookmark(position))
                next_bookmark = now + self.bookmark_seconds

    def _passes(self, obj: dict) -> bool:
        if self.namespace is not None and obj["metadata"].get("namespace", "") != self.namespace:
            return False
        return self._fields(obj) and self._labels(obj["metadata"].get("labels") or {})

    def _event(self, change: Change) -> dict | None:
        was = change.old is not None and self._passes(change.old)
        if change.new is not None and self._passes(change.new):
            return {"type": "MODIFIED" if was else "ADDED", "object": change.new}
        if not was:
            return None
        assert change.old is not None
        metadata = {**change.old["metadata"], "resourceVersion": str(change.resource_version)}
        return {"type": "DELETED", "object": {**change.old, "metadata": metadata}}

    def _current(self) -> list[dict]:
        stored = self.store.by_key(self.resource.kind)
        found = (stored[key] for key in self.store.keys(self.resource.kind))
        return [{"type": "ADDED", "object": obj} for obj in found if self._passes(obj)]

    def _bookmark(self, resource_version: int) -> dict:
        return {
            "type": "BOOKMARK",
            "object": {
                "apiVersion": self.resource.api_version,
                "kind": self.resource.kind,
                "metadata": {"resourceVersion": str(resource_version)},
            },
        }

    def _expired(self, resource_version: int) -> dict:
        oldest = self.store.compacted[self.resource.kind] + 1
        message = f"too old resource version: {resource_version} ({oldest})"
        return {"type": "ERROR", "object": status_body(code=410, message=message, reason="Expired")}

    @staticmethod
    def _line(event: dict[str, Any]) -> bytes:
        return json.dumps(event, separators=(",", ":")).encode() + b"\n"


class Watches:
    """The open watches of one server: opened by the REST layer, dropped by tests, ended when it stops."""

    def __init__(self, store: ClusterStore, *, bookmark_seconds: float = BOOKMARK_SECONDS) -> None:
        self.store = store
        self.bookmark_seconds = bookmark_seconds
        self._open: set[Watch] = set()
        self._closed = threading.Condition()

    def open(self, resource: Resource, namespace: str | None, query: dict[str, str]) -> Watch:
        watch = Watch(self.store, resource, namespace, query, bookmark_seconds=self.bookmark_seconds)
        with self._closed:
            self._open.add(watch)
        return watch

    def close(self, watch: Watch) -> None:
        with self._closed:
            self._open.discard(watch)
            self._closed.notify_all()

    @property
    def count(self) -> int:
        with self._closed:
            return len(self._open)

    def drop_all(self, *, wait: float = 5.0) -> int:
        """Cut every open watch; returns how many, once they are closed (or `wait` seconds have passed)."""
        with self._closed:
            dropped = list(self._open)
        for watch in dropped:
            watch.drop()
        with self.store.lock:
            self.store.changed.notify_all()
        deadline = time.monotonic() + wait
        with self._closed:
            while any(watch in self._open for watch in dropped) and time.monotonic() < deadline:
                self._closed.wait(deadline - time.monotonic())
        return len(dropped)
