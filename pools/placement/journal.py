"""Versions of one mutable structure: what each change wrote is journalled, so that any version can be brought
back, in time proportional to what differs, while the structure itself is changed in place.

Words used here:
- entry: an item of a dict (a missing key is a value too) or of a list. The versioned structure keeps all its
  versioned state in entries, and its dicts for good: a dict is emptied, never dropped, so that a journal may
  name it.
- version: one state of the entries. Each is made from another by a change; together they form a tree.
- current: the version the entries hold now. Every other version leads to it: `towards` the version one
  step nearer, with the `diff` that turns that version's entries back into its own (the first old value of
  each entry the step wrote), and the names (`touched`) that the step changed, for what is derived from the
  entries to be brought up to date.
- checkout: make a version current. Each step of the path to it is undone and its diff turned around, so
  that the version left behind leads to the new current one and can be checked out again (rerooting).

A version that nothing refers to any more is garbage like any object. A version kept while many were made
after it (the fleet a caller still holds while place_all goes on) keeps one diff, merged step by step, so
that it holds each entry at most once however long the chain grows.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any

__all__ = ["MISSING", "Journal", "Version"]

MISSING: Any = object()  # the value of a key a dict lacks

Entries = dict | list
Diff = dict[tuple[int, Hashable], tuple[Entries, Hashable, Any]]  # (id of dict, key) -> (dict, key, value)


def _value(entries: Entries, key: Hashable) -> Any:
    return entries.get(key, MISSING) if isinstance(entries, dict) else entries[key]


def _put(entries: Entries, key: Hashable, value: Any) -> None:
    if value is MISSING:
        entries.pop(key, None)
    else:
        entries[key] = value


class Version:
    """One version of the entries."""

    __slots__ = ("__weakref__", "diff", "owner", "touched", "towards")

    def __init__(self) -> None:
        self.towards: Version | None = None
        self.diff: Diff | None = None
        self.touched: set | None = None
        self.owner: Callable[[], object | None] | None = None  # a weak reference to who holds it

    def held(self) -> bool:
        return self.owner is not None and self.owner() is not None


class Journal:
    """Writes to the entries, and the versions they make."""

    def __init__(self) -> None:
        self.current = Version()
        self._writing: Diff | None = None
        # The last two versions left behind, for merging the steps that nobody holds (`_merge_behind`).
        self._behind: weakref.ref | None = None
        self._left: weakref.ref | None = None

    def set(self, entries: Entries, key: Hashable, value: Any) -> None:
        self._note(entries, key)
        entries[key] = value

    def delete(self, entries: dict, key: Hashable) -> None:
        self._note(entries, key)
        del entries[key]

    def _note(self, entries: Entries, key: Hashable) -> None:
        writing = self._writing
        if writing is not None:
            name = (id(entries), key)
            if name not in writing:  # the diff keeps the dict alive, so its id stays its own
                writing[name] = (entries, key, _value(entries, key))

    def begin(self) -> None:
        """Start a change of the current version; the writes until `commit` make the next one."""
        if self._writing is not None:
            raise RuntimeError("A change is already being written.")
        self._writing = {}

    def commit(self, touched: Iterable[Hashable]) -> Version:
        """The version the writes since `begin` made, now current; `touched` names what they changed."""
        diff, self._writing = self._writing, None
        if diff is None:
            raise RuntimeError("No change is being written.")
        made, left = Version(), self.current
        left.towards, left.diff, left.touched = made, diff, set(touched)
        self.current = made
        self._merge_behind(left)
        return made

    def abort(self) -> None:
        """Undo the writes since `begin`: the current version stays as it was."""
        diff, self._writing = self._writing, None
        for entries, key, value in (diff or {}).values():
            _put(entries, key, value)

    def checkout(self, version: Version) -> set[Hashable]:
        """Make `version` current; returns the names touched on the way."""
        if self._writing is not None:
            raise RuntimeError("A version cannot be checked out while a change is being written.")
        path = []
        step = version
        while step is not self.current:
            if step.towards is None:
                raise ValueError("The version is not one of this journal's.")
            path.append(step)
            step = step.towards
        touched: set[Hashable] = set()
        for step in reversed(path):  # each step leads to the current version
            here = self.current
            back: Diff = {}
            for name, (entries, key, value) in step.diff.items():
                back[name] = (entries, key, _value(entries, key))
                _put(entries, key, value)
            touched |= step.touched
            here.towards, here.diff, here.touched = step, back, step.touched
            step.towards = step.diff = step.touched = None
            self.current = step
        return touched

    def _merge_behind(self, left: Version) -> None:
        """Where nobody holds the version left behind by the change before (`previous`), the version left
        behind before that one (`behind`) leads past it, `previous`'s diff merged into its own (the older
        value of an entry wins): a chain of versions nobody holds, behind one that is held, collapses into
        one diff. `left`, just left behind, is `previous` at the next change."""
        behind = self._behind() if self._behind is not None else None
        previous = self._left() if self._left is not None else None
        if (
            behind is not None
            and previous is not None
            and behind.towards is previous
            and previous.diff is not None  # not current again
            and not previous.held()
        ):
            for name, entry in previous.diff.items():
                behind.diff.setdefault(name, entry)
            behind.towards = previous.towards
            behind.touched.update(previous.touched)
        else:
            self._behind = self._left
        self._left = weakref.ref(left)
