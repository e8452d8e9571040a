"""An agent's batch checked by hand: the types, ranges and lengths of monitoring.ingest.serializers, at the
speed of plain types, answering in the serializers' own words.

Words:
- batch: the JSON document an agent posts, `{"readings": [...]}`, in the shapes of
  monitoring.collectors.wire.
- check: what one field accepts, what it turns the value into (a figure given as 3 is 3.0, a text is
  stripped), and the messages it answers when it accepts nothing, exactly as the field of the same name
  in serializers.py (a Django REST framework field) would; `check_batch` applies them all.
- errors: the serializers' nesting of messages, field by field: `{"readings": {0: {"gpus": {1: {"power_w":
  ["…"]}}}}}`; a list's wrong items keyed by position, a wrong whole under `non_field_errors`.

The serializers describe the batch in the OpenAPI schema; this module is what the endpoint runs, since
a field-by-field serializer costs milliseconds for one node's batch. tests/monitoring/test_batch.py holds
the two to the same answers. The generic messages are the framework's own (its translations included),
so the two cannot drift apart in wording. NUL characters never reach a check: the JSON parser refuses
them first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Annotated, Any

import msgspec
from django.utils.translation import gettext_lazy as _
from rest_framework import fields as drf
from rest_framework import serializers as drf_serializers
from rest_framework.settings import api_settings
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from monitoring.collectors import GpuReading, InstanceReading, Reading

MAX_COUNT = 2**53  # bytes or error counts: far above any GPU's, and exact in a float
MAX_PROBLEMS = 50
MAX_PROBLEM_LENGTH = 500
MAX_XIDS = 1000
MAX_INSTANCES = 64
MAX_SLICE = 32
MAX_TIME_LENGTH = 64

TIME_INVALID = _("Give the time in ISO 8601 with its zone, e.g. 2026-05-01T10:00:15+00:00.")
TIME_NAIVE = _("The time has no zone: add one, e.g. +00:00 or Z.")
NO_SLICE = _("An instance occupies at least one slice.")

# The framework's messages, as its fields give them.
_REQUIRED = drf.Field.default_error_messages["required"]
_NULL = drf.Field.default_error_messages["null"]
_TEXT = drf.CharField.default_error_messages
_INTEGER = drf.IntegerField.default_error_messages
_NUMBER = drf.FloatField.default_error_messages
_BOOLEAN = drf.BooleanField.default_error_messages["invalid"]
_LIST = drf.ListField.default_error_messages
_MANY = drf_serializers.ListSerializer.default_error_messages
_NOT_A_DICT = drf_serializers.Serializer.default_error_messages["invalid"]
_NO_DATA = "No data provided"  # the serializers' words for a null body, untranslated by the framework too
_SURROGATE = ProhibitSurrogateCharactersValidator.message
_WHOLE = api_settings.NON_FIELD_ERRORS_KEY
_DECIMAL_TAIL = drf.IntegerField.re_decimal
_LONGEST_NUMBER = drf.IntegerField.MAX_STRING_LENGTH

MISSING = object()  # a key the document does not have


class Invalid(Exception):
    """The batch breaks the rules; `errors` says where and why, nested as the serializers nest them."""

    def __init__(self, errors: dict):
        super().__init__(errors)
        self.errors = errors


class _Wrong(Exception):
    """One field's answer: a list of messages, or a dict / positions for a nested whole."""

    def __init__(self, detail):
        self.detail = detail


Check = Callable[[Any], Any]


def _message(template, **values) -> str:
    return str(template).format(**values)


def _absent(required: bool, default):
    if required:
        raise _Wrong([str(_REQUIRED)])
    return default() if callable(default) else default


def text(*, max_length: int, blank: bool = False, null: bool = False, required: bool = True) -> Check:
    """A CharField: numbers are taken as their text; whitespace around is trimmed."""

    def check(value):
        if value is MISSING:
            return _absent(required, None)
        if type(value) is str:
            stripped = value.strip()
            if not stripped:
                if not blank:
                    raise _Wrong([str(_TEXT["blank"])])
                return ""
        else:
            if value is None:
                if not null:
                    raise _Wrong([str(_NULL)])
                return None
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _Wrong([str(_TEXT["invalid"])])
            stripped = str(value)  # a number's text has nothing to trim, and is never blank
        errors = []
        if len(stripped) > max_length:
            errors.append(_message(_TEXT["max_length"], max_length=max_length))
        if not stripped.isascii():
            for character in stripped:
                if 0xD800 <= ord(character) <= 0xDFFF:
                    errors.append(_message(_SURROGATE, code_point=ord(character)))
                    break
        if errors:
            raise _Wrong(errors)
        return stripped

    return check


def _within(value, low, high, messages: Mapping):
    """`value` when it lies within [low, high]; else the field's own message for the bound it passes."""
    if value > high:
        raise _Wrong([_message(messages["max_value"], max_value=high)])
    if value < low:
        raise _Wrong([_message(messages["min_value"], min_value=low)])
    return value


def integer(*, low: int, high: int, null: bool = False, required: bool = True) -> Check:
    """An IntegerField: a number or a text of one, with no fraction."""

    def check(value):
        if type(value) is not int:
            if value is MISSING:
                return _absent(required, None)
            if value is None:
                if not null:
                    raise _Wrong([str(_NULL)])
                return None
            if isinstance(value, str) and len(value) > _LONGEST_NUMBER:
                raise _Wrong([str(_INTEGER["max_string_length"])])
            try:
                value = int(_DECIMAL_TAIL.sub("", str(value)))
            except (ValueError, TypeError) as error:
                raise _Wrong([str(_INTEGER["invalid"])]) from error
        return _within(value, low, high, _INTEGER)

    return check


def number(*, low: float, high: float) -> Check:
    """A FloatField that may be null or absent (a figure not read): finite, within [low, high]."""

    def check(value):
        if type(value) is not float:
            if value is MISSING or value is None:
                return None
            if isinstance(value, str) and len(value) > _LONGEST_NUMBER:
                raise _Wrong([str(_NUMBER["max_string_length"])])
            try:
                value = float(value)
            except (TypeError, ValueError) as error:
                raise _Wrong([str(_NUMBER["invalid"])]) from error
            except OverflowError as error:
                raise _Wrong([str(_NUMBER["overflow"])]) from error
        if not math.isfinite(value):
            raise _Wrong([str(_NUMBER["invalid"])])
        return _within(value, low, high, _NUMBER)

    return check


def boolean_or_null(value):
    """A BooleanField that may be null or absent: the framework's spellings of true, false and null."""
    if value is True or value is False or value is None or value is MISSING:
        return None if value is MISSING else value
    try:
        lowered = value.lower() if isinstance(value, str) else value
        if lowered in drf.BooleanField.TRUE_VALUES:
            return True
        if lowered in drf.BooleanField.FALSE_VALUES:
            return False
        if lowered in drf.BooleanField.NULL_VALUES:
            return None
    except TypeError:  # a list or an object: not hashable, not a boolean
        pass
    raise _Wrong([str(_BOOLEAN)])


def aware_time(value) -> datetime:
    """An ISO 8601 time with its zone (serializers.AwareDateTimeField)."""
    if value is MISSING:
        raise _Wrong([str(_REQUIRED)])
    if value is None:
        raise _Wrong([str(_NULL)])
    if not isinstance(value, str) or len(value) > MAX_TIME_LENGTH:
        raise _Wrong([str(TIME_INVALID)])
    try:
        at = datetime.fromisoformat(value)
    except ValueError as error:
        raise _Wrong([str(TIME_INVALID)]) from error
    if at.tzinfo is None or at.utcoffset() is None:
        raise _Wrong([str(TIME_NAIVE)])
    return at


def items(
    child: Check,
    *,
    max_length: int | None = None,
    min_length: int | None = None,
    null: bool = False,
    default: Callable[[], Any] = list,
) -> Check:
    """A ListField of `child` that may be absent (then `default()`): wrong items by position; its length is
    checked once they are all right."""

    def check(value):
        if type(value) is not list:
            if value is MISSING:
                return default()
            if value is None:
                if not null:
                    raise _Wrong([str(_NULL)])
                return None
            raise _Wrong([_message(_LIST["not_a_list"], input_type=type(value).__name__)])
        result, errors = [], {}
        for position, item in enumerate(value):
            try:
                result.append(child(item))
            except _Wrong as wrong:
                errors[position] = wrong.detail
        if errors:
            raise _Wrong(errors)
        if max_length is not None and len(result) > max_length:
            raise _Wrong([_message(_LIST["max_length"], max_length=max_length)])
        if min_length is not None and len(result) < min_length:
            raise _Wrong([_message(_LIST["min_length"], min_length=min_length)])
        return result

    return check


def problems() -> Check:
    return items(text(max_length=MAX_PROBLEM_LENGTH, blank=True), max_length=MAX_PROBLEMS)


def _fields(data, checks: tuple[tuple[str, Check], ...]) -> list:
    """Each field of the object `data` checked in order: their values, or every wrong one's messages."""
    if not isinstance(data, Mapping):
        if data is None:
            raise _Wrong([str(_NULL)])
        raise _Wrong({_WHOLE: [_message(_NOT_A_DICT, datatype=type(data).__name__)]})
    values, errors = [], None
    get = data.get
    for name, check in checks:
        try:
            values.append(check(get(name, MISSING)))
        except _Wrong as wrong:
            if errors is None:
                errors = {}
            errors[name] = wrong.detail
    if errors:
        raise _Wrong(errors)
    return values


def many(
    child: Callable[[Any], Any], *, max_length: int | None = None, empty: bool = True, required: bool = False
) -> Check:
    """A nested serializer with many=True: the whole list refused under `non_field_errors`, else each
    wrong item by position."""

    def check(value):
        if type(value) is not list:
            if value is MISSING:
                return _absent(required, list)
            if value is None:
                raise _Wrong([str(_NULL)])
            raise _Wrong({_WHOLE: [_message(_MANY["not_a_list"], input_type=type(value).__name__)]})
        if not empty and not value:
            raise _Wrong({_WHOLE: [str(_MANY["empty"])]})
        if max_length is not None and len(value) > max_length:
            raise _Wrong({_WHOLE: [_message(_MANY["max_length"], max_length=max_length)]})
        result, errors = [], None
        for position, item in enumerate(value):
            try:
                result.append(child(item))
            except _Wrong as wrong:
                if errors is None:
                    errors = {}
                errors[position] = wrong.detail
        if errors:
            raise _Wrong(errors)
        return result

    return check


_count = integer(low=0, high=MAX_COUNT, null=True, required=False)
_percent = number(low=0, high=100)
_placement_items = items(
    integer(low=0, high=MAX_SLICE), min_length=2, max_length=2, null=True, default=lambda: None
)


def _placement(value):
    placement = _placement_items(value)
    if placement is not None and placement[1] < 1:
        raise _Wrong([str(NO_SLICE)])
    return placement


_INSTANCE = (
    ("uuid", text(max_length=64, blank=True)),
    ("gpu_instance_id", integer(low=-1, high=1023)),
    ("profile", text(max_length=32, blank=True, null=True, required=False)),
    ("placement", _placement),
    ("memory_used_bytes", _count),
    ("memory_total_bytes", _count),
    ("sm_active_pct", _percent),
    ("problems", problems()),
)


def _instance(data) -> InstanceReading:
    uuid, gpu_instance_id, profile, placement, used, total, sm, problems_ = _fields(data, _INSTANCE)
    return InstanceReading(
        uuid,
        gpu_instance_id,
        profile,
        (placement[0], placement[1]) if placement is not None else None,
        used,
        total,
        sm,
        tuple(problems_),
    )


_GPU = (
    ("index", integer(low=0, high=1023)),
    ("uuid", text(max_length=64, blank=True)),
    ("model", text(max_length=100, blank=True, null=True, required=False)),
    ("mig_enabled", boolean_or_null),
    ("power_w", number(low=0, high=5000)),
    ("temperature_c", number(low=-50, high=200)),
    ("utilisation_pct", _percent),
    ("sm_active_pct", _percent),
    ("memory_used_bytes", _count),
    ("memory_total_bytes", _count),
    ("ecc_corrected", _count),
    ("ecc_uncorrected", _count),
    ("xid_events", items(integer(low=0, high=2**31 - 1), max_length=MAX_XIDS)),
    ("problems", problems()),
    ("instances", many(_instance, max_length=MAX_INSTANCES)),
)


def _gpu(data) -> GpuReading:
    values = _fields(data, _GPU)
    return GpuReading(
        *values[:12], xid_events=tuple(values[12]), problems=tuple(values[13]), instances=tuple(values[14])
    )


_READING = (
    ("host", text(max_length=253)),
    ("at", aware_time),
    ("gpus", many(_gpu)),
    ("problems", problems()),
)


def _reading(data) -> Reading:
    host, at, gpus, problems_ = _fields(data, _READING)
    return Reading(host, at, tuple(gpus), tuple(problems_))


_readings = many(_reading, empty=False, required=True)


def check_batch(data) -> list[Reading]:
    """The readings of a parsed batch, oldest first as sent; Invalid when anything breaks the rules."""
    if data is None:
        raise Invalid({_WHOLE: [_NO_DATA]})
    try:
        (readings,) = _fields(data, (("readings", _readings),))
    except _Wrong as wrong:
        raise Invalid(wrong.detail) from None
    return readings


_KNOWN = {
    "batch": frozenset({"readings"}),
    "reading": frozenset(name for name, _check in _READING),
    "gpu": frozenset(name for name, _check in _GPU),
    "instance": frozenset(name for name, _check in _INSTANCE),
}


def only_known_keys(data) -> bool:
    """Whether every object of a batch that passed `check_batch` holds only the keys the rules name (an
    agent's always does); other keys are passed over, but may hide anything, as deep as it goes."""
    if not data.keys() <= _KNOWN["batch"]:
        return False
    reading_keys, gpu_keys, instance_keys = _KNOWN["reading"], _KNOWN["gpu"], _KNOWN["instance"]
    for reading in data["readings"]:
        if not reading.keys() <= reading_keys:
            return False
        for gpu in reading.get("gpus") or ():
            if not gpu.keys() <= gpu_keys:
                return False
            for instance in gpu.get("instances") or ():
                if not instance.keys() <= instance_keys:
                    return False
    return True


# --- the plain batch, read in C ------------------------------------------------------------------------
#
# An agent's batch is nearly always plainly right: every value in its column's own JSON type, no text with
# spaces around it, no key the rules do not name. Such a body is read and checked by msgspec straight into
# the shapes below, which are the collectors' own readings with the same bounds as the checks above, at a
# small part of their cost; anything else (a refusal's words, a number given as text, a text to trim, ...)
# is read by the checks above, so that what a body is taken as never depends on which of the two read it
# (tests/monitoring/test_batch.py).


def _text(longest: int, *, shortest: int = 0):
    return Annotated[str, msgspec.Meta(min_length=shortest, max_length=longest)]


_Problems = Annotated[tuple[_text(MAX_PROBLEM_LENGTH), ...], msgspec.Meta(max_length=MAX_PROBLEMS)]
_Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
_Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
_Slice = Annotated[int, msgspec.Meta(ge=0, le=MAX_SLICE)]
_Slices = Annotated[int, msgspec.Meta(ge=1, le=MAX_SLICE)]


class _PlainInstance(InstanceReading, frozen=True, forbid_unknown_fields=True):
    uuid: _text(64)
    gpu_instance_id: Annotated[int, msgspec.Meta(ge=-1, le=1023)]
    profile: _text(32) | None = None
    placement: tuple[_Slice, _Slices] | None = None
    memory_used_bytes: _Count | None = None
    memory_total_bytes: _Count | None = None
    sm_active_pct: _Percent | None = None
    problems: _Problems = ()


class _PlainGpu(GpuReading, frozen=True, forbid_unknown_fields=True):
    index: Annotated[int, msgspec.Meta(ge=0, le=1023)]
    uuid: _text(64)
    model: _text(100) | None = None
    mig_enabled: bool | None = None
    power_w: Annotated[float, msgspec.Meta(ge=0, le=5000)] | None = None
    temperature_c: Annotated[float, msgspec.Meta(ge=-50, le=200)] | None = None
    utilisation_pct: _Percent | None = None
    sm_active_pct: _Percent | None = None
    memory_used_bytes: _Count | None = None
    memory_total_bytes: _Count | None = None
    ecc_corrected: _Count | None = None
    ecc_uncorrected: _Count | None = None
    xid_events: Annotated[
        tuple[Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)], ...], msgspec.Meta(max_length=MAX_XIDS)
    ] = ()
    instances: Annotated[tuple[_PlainInstance, ...], msgspec.Meta(max_length=MAX_INSTANCES)] = ()
    problems: _Problems = ()


class _PlainReading(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    host: _text(253, shortest=1)
    at: Annotated[str, msgspec.Meta(max_length=MAX_TIME_LENGTH)]  # as the checks read it: aware_time
    gpus: tuple[_PlainGpu, ...] = ()
    problems: _Problems = ()


class _PlainBatch(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    readings: Annotated[list[_PlainReading], msgspec.Meta(min_length=1)]


_PLAIN = msgspec.json.Decoder(_PlainBatch)


def plain_batch(body: bytes, *, max_readings: int, max_gpus: int) -> list[Reading] | None:
    """The readings of a plainly right batch, as `check_batch` takes them, holding at most `max_readings`
    readings and `max_gpus` GPU readings; None when the body is anything else (read it with the checks).
    Their GPUs and instances are of the bounded kinds above: equal in every field to those `check_batch`
    makes, though not of the same class."""
    if b"\\u0000" in body:  # a NUL: the parser's own refusal comes first
        return None
    try:
        batch = _PLAIN.decode(body)
    except msgspec.DecodeError:  # a ValidationError too
        return None
    if len(batch.readings) > max_readings or sum(len(r.gpus) for r in batch.readings) > max_gpus:
        return None
    readings = []
    for reading in batch.readings:
        try:
            at = aware_time(reading.at)
        except _Wrong:
            return None
        if not _as_is(reading):
            return None
        readings.append(Reading(reading.host, at, reading.gpus, reading.problems))
    return readings


def _as_is(reading: _PlainReading) -> bool:
    """Whether the checks would take every text of `reading` as it is, with nothing to strip at either end (a
    check in the decoder's pattern would cost more than reading the whole batch; msgspec refuses a lone
    surrogate itself)."""
    texts = [reading.host, *reading.problems]
    for gpu in reading.gpus:
        texts += (gpu.uuid, gpu.model or "", *gpu.problems)
        for instance in gpu.instances:
            texts += (instance.uuid, instance.profile or "", *instance.problems)
    return all(text.strip() == text for text in texts)
