"""Watches as the Kubernetes driver follows them: one thread per stream reads a watch's newline-delimited
events as they come and hands them on; the caller's thread merges them (`follow`).

Words used here (base.py's, and the Kubernetes API's):
- follower: the thread of one stream. It watches from the stream's version with bookmarks allowed, resumes
  from the last version it saw (an event's or a bookmark's) when the server ends the stream or it breaks,
  and gives up on a stream that keeps breaking without bringing anything. Its first request asks a short
  `timeoutSeconds` (FIRST_SECONDS), the next ones what is left of the watch's time;
- caught up: a stream whose server has sent a bookmark: everything up to it has come. A server need not
  send one; a real one sends one shortly before a watch's `timeoutSeconds` runs out, which the short first
  request makes soon. The watch's time bounds the wait in any case.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from pools.drivers.base import CaughtUp, Expired, Progress, Quiet

CONNECT_SECONDS = 5
READ_GRACE_SECONDS = (
    15  # past `timeoutSeconds`, how long a silent stream is waited on before it counts as broken
)
QUIET_SECONDS = 0.2  # nothing for this long after something came: Quiet
FIRST_SECONDS = 3  # the first request's timeoutSeconds
RESUMES = 3  # a stream that breaks this many times in a row without bringing anything is given up


@dataclass(frozen=True)
class Event:
    """A watch event as the server sent it: ADDED, MODIFIED or DELETED, with the object's JSON."""

    stream: str
    type: str
    obj: dict
    version: str


@dataclass(frozen=True)
class _Ended:
    stream: str


@dataclass(frozen=True)
class _Failed:
    stream: str
    error: BaseException


class Follower(threading.Thread):
    """The thread that follows one stream; what it reads goes to `out`, ended by _Ended or _Failed."""

    def __init__(
        self,
        stream: str,
        call: Callable[..., Any],
        kwargs: Mapping[str, Any],
        version: str,
        deadline: float,
        out: queue.Queue,
    ) -> None:
        super().__init__(name=f"watch-{stream}", daemon=True)
        self.stream, self.call, self.kwargs = stream, call, dict(kwargs)
        self.version, self.deadline, self.out = version, deadline, out
        self._stopped = threading.Event()
        self._response: Any = None

    def stop(self) -> None:
        """End the stream now: its socket is shut, which wakes a read that waits on it."""
        self._stopped.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.connection.sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        try:
            self._follow()
        except Exception as error:  # handed to the caller's thread, which raises it there
            if not self._stopped.is_set():
                self.out.put(_Failed(self.stream, error))
        finally:
            self.out.put(_Ended(self.stream))

    def _follow(self) -> None:
        breaks, first = 0, True
        while not self._stopped.is_set() and (left := self.deadline - time.monotonic()) > 0:
            seconds = max(1, math.ceil(min(left, FIRST_SECONDS) if first else left))
            first = False
            response = self.call(
                watch=True,
                resource_version=self.version,
                timeout_seconds=seconds,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=(CONNECT_SECONDS, seconds + READ_GRACE_SECONDS),
                **self.kwargs,
            )
            self._response = response
            brought = False
            try:
                for line in iter_resp_lines(response):
                    if self._stopped.is_set():
                        return
                    if line.strip():
                        brought = self._event(json.loads(line)) or brought
            except (urllib3.exceptions.HTTPError, OSError):  # broken: resume from the last version seen
                if self._stopped.is_set():
                    return
                breaks = 0 if brought else breaks + 1
                if breaks >= RESUMES:
                    raise
            finally:
                self._response = None
                with contextlib.suppress(Exception):
                    response.release_conn()

    def _event(self, event: dict) -> bool:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(self.stream, obj.get("message") or "")
            raise ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
        self.version = (obj.get("metadata") or {}).get("resourceVersion") or self.version
        if kind == "BOOKMARK":
            self.out.put(Progress(self.stream, self.version))
        else:
            self.out.put(Event(self.stream, str(kind), obj, self.version))
        return True


def follow(
    streams: Mapping[str, tuple[Callable[..., Any], Mapping[str, Any], str]], seconds: float
) -> Iterator[Event | Progress | CaughtUp | Quiet]:
    """Watch each stream (`{stream: (list call, its arguments, version)}`) for at most `seconds`: events,
    Progress at each bookmark, CaughtUp once every stream has had one, Quiet after a lull. Raises what a
    follower met (Expired, ApiException, a broken connection); closing the iterator stops them all."""
    out: queue.Queue = queue.Queue()
    deadline = time.monotonic() + seconds
    followers = [
        Follower(stream, call, kwargs, version, deadline, out)
        for stream, (call, kwargs, version) in streams.items()
    ]
    waiting = set(streams)
    running = len(followers)
    lull = False  # something came since the last Quiet
    try:
        for follower in followers:
            follower.start()
        while running:
            try:
                item = out.get(timeout=QUIET_SECONDS if lull else 1.0)
            except queue.Empty:
                if lull:
                    lull = False
                    yield Quiet()
                elif time.monotonic() > deadline + READ_GRACE_SECONDS + CONNECT_SECONDS:
                    return  # a server that holds a stream past its timeout: it is cut by the `finally`
                continue
            if isinstance(item, _Ended):
                running -= 1
            elif isinstance(item, _Failed):
                raise item.error
            elif isinstance(item, Progress):
                yield item
                if item.stream in waiting:
                    waiting.discard(item.stream)
                    if not waiting:
                        yield CaughtUp()
            else:
                lull = True
                yield item
    finally:
        for follower in followers:
            follower.stop()
        for follower in followers:
            follower.join(timeout=CONNECT_SECONDS)
