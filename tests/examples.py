"""How many examples a property test draws: every one of them in the whole suite (what CI runs), a quarter
in the inner loop (`./scripts/test --fast` sets TEST_EXAMPLES=quarter), never fewer than 10. A property
that names its own count passes it through `examples(n)`; those that name none draw Hypothesis's default
(100), which the inner loop's profile quarters too (`load_profile`, from tests/conftest.py). A test run
over seeded scenarios takes them through `scenarios(cases)`: all, or every fourth in the inner loop."""

import os

from hypothesis import settings

SHARE = 4 if os.environ.get("TEST_EXAMPLES") == "quarter" else 1


def examples(count: int) -> int:
    return count if SHARE == 1 else max(10, count // SHARE)


def load_profile() -> None:
    settings.register_profile("inner-loop", max_examples=examples(settings.default.max_examples))
    if SHARE > 1:
        settings.load_profile("inner-loop")


def scenarios(cases: list) -> list:
    return cases if SHARE == 1 else cases[::SHARE]
