"""docs/traces.md tells the truth: each example trace there, run through its command, gives the answer the
page shows, and every key the trace readers take or write is named on the page."""

import json
import re

import pytest

from tests.pools.trace_commands import ROOT, run_command

PAGE = ROOT / "docs" / "traces.md"
READERS = ("pools/placement/trace.py", "pools/placement/timetrace.py")
# The page's JSON examples in order: a placement trace and its answer, then a simulation trace and its answer.
EXAMPLES = ("place", "simulate")
# A key the readers take: the second argument of a field reader, e.g. _flag(raw, "mig", ...).
READ_KEY = re.compile(r'(?:_text|_optional_text|_flag|whole_number|list_field|_whole)\(\w+, "(\w+)"')
WRITTEN_KEY = re.compile(r'"(\w+)": ')  # a key of a dict the writers build, e.g. {"id": ...}


def json_blocks() -> list[object]:
    text = PAGE.read_text(encoding="utf-8")
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", text, flags=re.DOTALL)]


@pytest.mark.parametrize("number", range(len(EXAMPLES)))
def test_each_example_gets_the_answer_the_page_shows(number):
    blocks = json_blocks()
    assert len(blocks) == 2 * len(EXAMPLES)
    trace, answer = blocks[2 * number], blocks[2 * number + 1]
    out, _ = run_command(EXAMPLES[number], "--input", "-", stdin=json.dumps(trace))
    assert json.loads(out) == answer


def test_every_key_of_the_readers_and_writers_is_named_on_the_page():
    keys: set[str] = set()
    for reader in READERS:
        source = (ROOT / reader).read_text(encoding="utf-8")
        keys |= set(READ_KEY.findall(source)) | set(WRITTEN_KEY.findall(source))
    # The patterns still find keys of each kind: read from a GPU, from the simulation trace, and written.
    assert {"mig", "schedulable", "backfill_grace_seconds", "admitted_at", "reason"} <= keys
    text = PAGE.read_text(encoding="utf-8")
    assert sorted(key for key in keys if f"`{key}`" not in text and f'"{key}"' not in text) == []
