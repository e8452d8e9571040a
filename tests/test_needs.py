"""What a test needs is read from its code (tests/needs.py), so `./scripts/test --fast` leaves out exactly
the tests that need a browser, a fuzzer, a worker or another process."""

import subprocess
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.needs import Reach, needs
from tests.portal import test_bad_input


def starts_a_process():
    subprocess.run(["true"], check=True)


def calls_a_helper_that_starts_a_process():
    return starts_a_process()


def plain():
    return sum(range(3))


def test_a_helper_that_says_what_it_is_marks_every_test_that_reaches_it():
    reach = Reach()
    assert "fuzz" in reach.of(test_bad_input.test_no_url_of_the_site_answers_5xx_to_bad_input)
    assert "fuzz" not in reach.of(test_bad_input.test_the_walk_covers_every_part_of_the_site)
    assert {"celery", "process"} <= reach.of(conftest.running_worker)


def test_what_code_reaches_is_followed_through_helpers():
    reach = Reach()
    assert reach.of(calls_a_helper_that_starts_a_process) == {"process"}
    assert reach.of(plain) == set()


def test_a_helper_can_only_say_it_needs_a_known_thing():
    with pytest.raises(ValueError, match="'gpu' is none of"):
        needs("gpu")


@pytest.mark.parametrize(
    ("expression", "collected"),
    [("", True), ("fuzz", True), ("not fuzz", False), ("not (browser or fuzz or celery or process)", False),
     ("not browser", True)],
)  # fmt: skip
def test_the_fuzzer_module_is_collected_only_where_fuzz_tests_run(expression, collected):
    config = SimpleNamespace(getoption=lambda name: expression)
    path = next(iter(conftest.FUZZ_MODULES))
    assert (conftest.pytest_ignore_collect(path, config) is None) is collected
