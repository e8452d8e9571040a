"""The journal of the engine's index (pools/placement/journal.py): any version checked out again holds exactly
the entries it held, whichever versions were made or checked out since."""

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pools.placement.journal import Journal, Version
from tests.pools.test_placement_properties import PROPERTY

KEYS = ["a", "b", "c", 0, 1]

# A change: writes (set: a key and a value; delete: a key, when there) to one of the dicts or the list.
writes_ = st.lists(
    st.tuples(st.sampled_from(["dict", "other", "list"]), st.sampled_from(KEYS), st.integers(-1, 3)),
    min_size=1,
    max_size=6,
)


class Held:
    """Stands for a fleet: what holds a version (the journal refers to it weakly)."""


def entries() -> dict:
    return {"dict": {}, "other": {"x": 1}, "list": [0, 0, 0]}


def write(journal: Journal, state: dict, writes: list) -> None:
    for name, key, value in writes:
        entries = state[name]
        if name == "list":
            journal.set(entries, KEYS.index(key) % 3 if isinstance(key, str) else key, value)
        elif value < 0:
            if key in entries:
                journal.delete(entries, key)
        else:
            journal.set(entries, key, value)


@PROPERTY
@given(st.lists(st.tuples(st.integers(0, 20), writes_, st.booleans()), min_size=1, max_size=12))
def test_a_version_checked_out_again_holds_what_it_held(steps):
    """Each step checks out a version made before (the tree branches) and makes a new one from it."""
    state = entries()
    journal = Journal()
    made: list[tuple[Version, dict, Held | None]] = [(journal.current, copy.deepcopy(state), Held())]
    made[0][0].owner = lambda held=made[0][2]: held
    for pick, writes, hold in steps:
        version, _before, _held = made[pick % len(made)]
        journal.checkout(version)
        journal.begin()
        write(journal, state, writes)
        new = journal.commit({name for name, _key, _value in writes})
        held = Held() if hold else None
        if held is not None:
            new.owner = lambda held=held: held
        made.append((new, copy.deepcopy(state), held))
    for version, before, _held in reversed(made):
        journal.checkout(version)
        assert state == before
    for version, before, _held in made:
        journal.checkout(version)
        assert state == before


def test_a_version_held_while_many_are_made_keeps_one_diff_of_what_changed():
    """As in place_all: the caller holds the fleet it passed, each fleet made is dropped once the next is."""
    state = entries()
    journal = Journal()
    first, before = journal.current, copy.deepcopy(state)
    holder = Held()
    first.owner = lambda: holder
    for n in range(500):
        journal.begin()
        journal.set(state["dict"], n % 7, n)
        journal.set(state["list"], n % 3, n)
        journal.commit({n % 7})
    assert len(first.diff) <= 10  # each entry once, however many versions came after
    journal.checkout(first)
    assert state == before


def test_a_change_that_fails_half_way_leaves_the_version_as_it_was():
    state = entries()
    journal = Journal()
    journal.begin()
    journal.set(state["dict"], "a", 1)
    journal.delete(state["other"], "x")
    journal.abort()
    assert state == entries()
    with pytest.raises(RuntimeError):
        journal.commit(set())
