"""The hand-written checks of an agent's batch (monitoring.ingest.batch): each rule, each type error, in the
words of the serializers that describe the batch in the schema; and the two held to the same answers on any
change to a good batch."""

import copy
import json
import math
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.collectors.wire import batch_to_json, from_json
from monitoring.ingest.batch import MAX_COUNT, Invalid, check_batch, only_known_keys, plain_batch
from monitoring.ingest.serializers import BatchSerializer
from tests.examples import examples

AT = datetime(2026, 5, 1, 10, 0, 15, tzinfo=UTC)
GOOD = Reading(
    "gpu-node-1",
    AT,
    (
        GpuReading(0, "GPU-a", "NVIDIA H100", False, 300.0, 55.0, 70.0, 60.0, 1, 2, 0, 0, (79,), (), ("p",)),
        GpuReading(
            1,
            "GPU-b",
            None,
            True,
            power_w=200.0,
            instances=(InstanceReading("MIG-1", 1, "3g.40gb", (0, 4), 1, 2, 30.0, ()),),
        ),
    ),
)
GPU = ("readings", 0, "gpus", 0)
INSTANCE = ("readings", 0, "gpus", 1, "instances", 0)


def good() -> dict:
    return batch_to_json([GOOD])


def changed(path, value) -> dict:
    body = good()
    target = body
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return body


def errors(body) -> dict:
    with pytest.raises(Invalid) as refused:
        check_batch(body)
    return json.loads(json.dumps(refused.value.errors))


def at(errors: dict, *path):
    for step in path:
        errors = errors[str(step)] if isinstance(errors, dict) and str(step) in errors else errors[step]
    return errors


def test_a_good_batch_is_its_readings():
    assert check_batch(good()) == [GOOD]


def test_absent_figures_lists_and_instances_take_their_defaults():
    body = {"readings": [{"host": "h", "at": AT.isoformat(), "gpus": [{"index": 0, "uuid": "GPU-a"}]}]}
    assert check_batch(body) == [Reading("h", AT, (GpuReading(0, "GPU-a"),))]


def test_texts_are_trimmed_and_numbers_taken_as_text():
    body = changed(("readings", 0, "host"), "  gpu-node-1 ")
    body["readings"][0]["gpus"][0]["uuid"] = 42
    [reading] = check_batch(body)
    assert reading.host == "gpu-node-1" and reading.gpus[0].uuid == "42"


def test_numbers_come_in_the_types_of_their_columns():
    body = changed((*GPU, "power_w"), 300)
    body["readings"][0]["gpus"][0]["index"] = "1.0"
    body["readings"][0]["gpus"][0]["memory_used_bytes"] = 7.0
    gpu = check_batch(body)[0].gpus[0]
    assert (gpu.power_w, type(gpu.power_w)) == (300.0, float)
    assert (gpu.index, gpu.memory_used_bytes) == (1, 7) and type(gpu.memory_used_bytes) is int


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("readings", 0, "host"), "  ", "This field may not be blank."),
        (("readings", 0, "host"), ["h"], "Not a valid string."),
        (("readings", 0, "host"), True, "Not a valid string."),
        (("readings", 0, "host"), "h" * 254, "Ensure this field has no more than 253 characters."),
        (("readings", 0, "host"), None, "This field may not be null."),
        ((*GPU, "uuid"), "GPU-\ud800", "Surrogate characters are not allowed: U+D800."),
        ((*INSTANCE, "profile"), "p" * 33, "Ensure this field has no more than 32 characters."),
        ((*GPU, "index"), "zero", "A valid integer is required."),
        ((*GPU, "index"), 1.5, "A valid integer is required."),
        ((*GPU, "index"), True, "A valid integer is required."),
        ((*GPU, "index"), "1" * 1001, "String value too large."),
        ((*GPU, "index"), -1, "Ensure this value is greater than or equal to 0."),
        ((*GPU, "index"), 1024, "Ensure this value is less than or equal to 1023."),
        ((*GPU, "ecc_uncorrected"), MAX_COUNT + 1, f"less than or equal to {MAX_COUNT}."),
        ((*GPU, "power_w"), "hot", "A valid number is required."),
        ((*GPU, "power_w"), math.inf, "A valid number is required."),
        ((*GPU, "power_w"), 2**1100, "Integer value too large to convert to float"),
        ((*GPU, "power_w"), -0.5, "Ensure this value is greater than or equal to 0."),
        ((*GPU, "temperature_c"), 200.5, "Ensure this value is less than or equal to 200."),
        ((*GPU, "mig_enabled"), "maybe", "Must be a valid boolean."),
        ((*GPU, "mig_enabled"), [True], "Must be a valid boolean."),
        (("readings", 0, "at"), 12345, "Give the time in ISO 8601 with its zone"),
        (("readings", 0, "at"), "2026-05-01T10:00:15", "The time has no zone"),
        (("readings", 0, "at"), None, "This field may not be null."),
        ((*INSTANCE, "placement"), [0, 0], "An instance occupies at least one slice."),
        ((*INSTANCE, "placement"), [0], "Ensure this field has at least 2 elements."),
        ((*INSTANCE, "placement"), [0, 1, 2], "Ensure this field has no more than 2 elements."),
        ((*INSTANCE, "placement"), "0,4", 'Expected a list of items but got type "str".'),
        ((*GPU, "problems"), ["p"] * 51, "Ensure this field has no more than 50 elements."),
        ((*GPU, "problems"), None, "This field may not be null."),
    ],
)
def test_each_wrong_field_is_named_with_the_serializers_message(path, value, message):
    found = at(errors(changed(path, value)), *path)
    assert isinstance(found, list) and message in found[0]


def test_an_absent_required_field_is_required():
    body = good()
    del body["readings"][0]["gpus"][1]["instances"][0]["uuid"]
    del body["readings"][0]["at"]
    found = errors(body)
    assert at(found, "readings", 0, "at") == ["This field is required."]
    assert at(found, *INSTANCE, "uuid") == ["This field is required."]


def test_wrong_items_of_a_list_are_named_by_position_and_its_length_waits_for_them():
    wrong = errors(changed((*GPU, "problems"), ["ok", 5.5, None] + ["p"] * 60))
    assert at(wrong, *GPU, "problems") == {"2": ["This field may not be null."]}  # 5.5 is text "5.5"
    assert at(errors(changed((*GPU, "xid_events"), [79, "x"])), *GPU, "xid_events") == {
        "1": ["A valid integer is required."]
    }


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (None, {"non_field_errors": ["No data provided"]}),
        ([], {"non_field_errors": ["Invalid data. Expected a dictionary, but got list."]}),
        ({}, {"readings": ["This field is required."]}),
        ({"readings": None}, {"readings": ["This field may not be null."]}),
        (
            {"readings": {}},
            {"readings": {"non_field_errors": ['Expected a list of items but got type "dict".']}},
        ),
        ({"readings": []}, {"readings": {"non_field_errors": ["This list may not be empty."]}}),
        ({"readings": [None]}, {"readings": {"0": ["This field may not be null."]}}),
        (
            {"readings": [5]},
            {"readings": {"0": {"non_field_errors": ["Invalid data. Expected a dictionary, but got int."]}}},
        ),
    ],
)
def test_a_wrong_whole_is_refused_under_non_field_errors(body, expected):
    assert errors(body) == expected


def test_too_many_instances_refuse_the_list_whole():
    body = changed((*INSTANCE[:-1],), [good()["readings"][0]["gpus"][1]["instances"][0]] * 65)
    assert at(errors(body), "readings", 0, "gpus", 1, "instances") == {
        "non_field_errors": ["Ensure this field has no more than 64 elements."]
    }


def test_every_wrong_field_is_named_at_once_in_the_order_of_the_schema():
    body = changed((*GPU, "power_w"), "hot")
    body["readings"][0]["gpus"][0]["index"] = -1
    body["readings"][0]["host"] = ""
    assert list(errors(body)["readings"]["0"]) == ["host", "gpus"]
    assert list(at(errors(body), *GPU)) == ["index", "power_w"]


def test_keys_the_batch_does_not_name_are_passed_over_but_noticed():
    body = changed((*INSTANCE, "note"), {"a": [1]})
    assert check_batch(body) == [GOOD]
    assert not only_known_keys(body)
    assert only_known_keys(good())


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["", " 7 ", "1.0", "1.5", "true", "NULL", "yes", "1e999", "nan", "1_0", "\ud800"])
    | st.just("x" * 70),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
PATHS = [
    (),
    ("readings",),
    ("readings", 0),
    ("readings", 0, "host"),
    ("readings", 0, "at"),
    ("readings", 0, "gpus"),
    ("readings", 0, "problems"),
    GPU,
    *((*GPU, name) for name in batch_to_json([GOOD])["readings"][0]["gpus"][0]),
    (*GPU, "xid_events", 0),
    (*GPU, "problems", 0),
    ("readings", 0, "gpus", 1, "instances"),
    INSTANCE,
    *((*INSTANCE, name) for name in batch_to_json([GOOD])["readings"][0]["gpus"][1]["instances"][0]),
    (*INSTANCE, "placement", 1),
]
GONE = object()


def _apply(body, changes):
    for path, value in changes:
        if not path:
            body = None if value is GONE else value
            continue
        target = body
        try:
            for step in path[:-1]:
                target = target[step]
            if value is GONE:
                del target[path[-1]]
            else:
                target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            pass
    return body


CHANGES = st.lists(st.tuples(st.sampled_from(PATHS), json_values | st.just(GONE)), min_size=1, max_size=3)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=CHANGES)
def test_the_checks_answer_as_the_serializers_would_whatever_a_batch_holds(changes):
    body = _apply(copy.deepcopy(good()), changes)
    serializer = BatchSerializer(data=copy.deepcopy(body))
    try:
        readings = check_batch(body)
    except Invalid as invalid:
        assert not serializer.is_valid()
        # The same words, in the same order.
        assert json.dumps(invalid.errors) == json.dumps(serializer.errors)
    else:
        assert serializer.is_valid(), serializer.errors
        assert readings == [from_json(reading) for reading in serializer.validated_data["readings"]]


def plain(body, *, ascii_only: bool = True, max_readings: int = 1000, max_gpus: int = 20000):
    raw = json.dumps(body, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    return plain_batch(raw, max_readings=max_readings, max_gpus=max_gpus)


def same(taken: list[Reading], expected: list[Reading]) -> bool:
    """Whether the readings hold the same values of the same types, field by field: the plain reading's
    GPUs and instances are of its own bounded classes, which never equal the collectors' own."""
    return msgspec.json.encode(taken) == msgspec.json.encode(expected)


def test_a_plainly_right_batch_is_read_in_c_as_the_checks_read_it():
    body = batch_to_json([GOOD, GOOD])
    taken = plain(body)
    assert same(taken, check_batch(copy.deepcopy(body)))
    assert same(taken, [GOOD, GOOD])
    assert all(isinstance(gpu, GpuReading) for reading in taken for gpu in reading.gpus)
    assert not same(taken, [GOOD, replace(GOOD, problems=("p",))])
    assert plain({"readings": [{"host": "gpu-node-1", "at": AT.isoformat()}]}) == [Reading("gpu-node-1", AT)]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("readings", 0, "host"), " gpu-node-1"),  # trimmed by the checks
        (("readings", 0, "host"), 7),  # taken as its text
        ((*GPU, "power_w"), "300"),
        ((*GPU, "index"), 1.0),
        ((*GPU, "mig_enabled"), "true"),
        ((*GPU, "problems", 0), "p "),
        ((*INSTANCE, "profile"), "   "),
        ((*GPU, "extra"), 1),  # a key the rules do not name
        ((*GPU, "uuid"), "GPU-\x00"),  # a NUL: the parser refuses it first
        (("readings", 0, "at"), "2026-05-01T10:00:15"),  # no zone: refused
        ((*GPU, "temperature_c"), 201.0),  # refused
    ],
)
def test_anything_but_a_plain_batch_is_left_to_the_checks(path, value):
    body = changed(path, value)
    assert plain(body) is None


def test_a_batch_over_the_limits_is_left_to_the_checks_that_refuse_it():
    body = batch_to_json([GOOD, GOOD])
    assert plain(body, max_readings=1) is None
    assert plain(body, max_gpus=3) is None
    assert plain(body, max_readings=2, max_gpus=4) is not None


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=CHANGES, ascii_only=st.booleans())
def test_what_the_plain_reading_takes_the_checks_take_alike(changes, ascii_only):
    body = _apply(copy.deepcopy(good()), changes)
    try:
        taken = plain(body, ascii_only=ascii_only)
    except (TypeError, ValueError):  # not JSON at all (NaN), or a lone surrogate UTF-8 cannot carry
        return
    if taken is not None:
        assert same(taken, check_batch(body))
