"""What a node agent's batch may hold (POST /api/v1/monitoring/samples/), and what the portal answers, as the
OpenAPI schema describes them.

The shapes are those of monitoring.collectors.wire (the JSON of the collector's Reading), with the types,
ranges and lengths that keep anything a database column cannot hold (or a reader would not believe) from
`ingest`. Figures may be null: a collector that could not read one says why in `problems`. The endpoint
checks a batch with monitoring.ingest.batch, the same rules by hand with the same answers (the tests hold
the two together); these serializers describe them.
"""

from __future__ import annotations

from datetime import datetime

from django.utils.translation import gettext_lazy as _
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from monitoring.ingest.batch import (
    MAX_COUNT,
    MAX_INSTANCES,
    MAX_PROBLEM_LENGTH,
    MAX_PROBLEMS,
    MAX_SLICE,
    MAX_TIME_LENGTH,
    MAX_XIDS,
    NO_SLICE,
    TIME_INVALID,
    TIME_NAIVE,
)


@extend_schema_field(OpenApiTypes.DATETIME)
class AwareDateTimeField(serializers.Field):
    """An ISO 8601 time that carries its zone (`2026-05-01T10:00:15+00:00` or `…Z`); a naive one is
    refused, since the portal cannot tell which instant it means."""

    default_error_messages = {"invalid": TIME_INVALID, "naive": TIME_NAIVE}

    def to_internal_value(self, data) -> datetime:
        if not isinstance(data, str) or len(data) > MAX_TIME_LENGTH:
            self.fail("invalid")
        try:
            at = datetime.fromisoformat(data)
        except ValueError:
            self.fail("invalid")
        if at.tzinfo is None or at.utcoffset() is None:
            self.fail("naive")
        return at

    def to_representation(self, value: datetime) -> str:
        return value.isoformat()


def _figure(low: float, high: float, help_text: str) -> serializers.FloatField:
    return serializers.FloatField(
        min_value=low, max_value=high, allow_null=True, required=False, default=None, help_text=help_text
    )


def _count(help_text: str) -> serializers.IntegerField:
    return serializers.IntegerField(
        min_value=0, max_value=MAX_COUNT, allow_null=True, required=False, default=None, help_text=help_text
    )


def _problems() -> serializers.ListField:
    return serializers.ListField(
        child=serializers.CharField(max_length=MAX_PROBLEM_LENGTH, allow_blank=True),
        max_length=MAX_PROBLEMS,
        required=False,
        default=list,
        help_text=_('What could not be read, one line each ("power: not supported").'),
    )


def _percent(help_text: str) -> serializers.FloatField:
    return _figure(0, 100, help_text)


class InstanceReadingSerializer(serializers.Serializer):
    uuid = serializers.CharField(max_length=64, allow_blank=True)
    gpu_instance_id = serializers.IntegerField(min_value=-1, max_value=1023, help_text=_("-1: unknown."))
    profile = serializers.CharField(
        max_length=32, allow_null=True, allow_blank=True, required=False, default=None
    )
    placement = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=MAX_SLICE),
        min_length=2,
        max_length=2,
        allow_null=True,
        required=False,
        default=None,
        help_text=_("[first memory slice, slices], or null when NVML does not say."),
    )
    memory_used_bytes = _count(_("Memory used by the instance."))
    memory_total_bytes = _count(_("The instance's memory."))
    sm_active_pct = _percent(_("SM activity of the instance, 0–100."))
    problems = _problems()

    def validate_placement(self, value):
        if value is not None and value[1] < 1:
            raise serializers.ValidationError(NO_SLICE)
        return value


class GpuReadingSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=1023)
    uuid = serializers.CharField(max_length=64, allow_blank=True)
    model = serializers.CharField(
        max_length=100, allow_null=True, allow_blank=True, required=False, default=None
    )
    mig_enabled = serializers.BooleanField(allow_null=True, required=False, default=None)
    power_w = _figure(0, 5000, _("Power draw in watts."))
    temperature_c = _figure(-50, 200, _("Temperature in °C."))
    utilisation_pct = _percent(_("Utilisation, 0–100 (none on a MIG-enabled GPU)."))
    sm_active_pct = _percent(_("SM activity, 0–100."))
    memory_used_bytes = _count(_("Memory used."))
    memory_total_bytes = _count(_("The GPU's memory."))
    ecc_corrected = _count(_("Corrected ECC errors since the driver loaded."))
    ecc_uncorrected = _count(_("Uncorrected ECC errors since the driver loaded."))
    xid_events = serializers.ListField(
        child=serializers.IntegerField(min_value=0, max_value=2**31 - 1),
        max_length=MAX_XIDS,
        required=False,
        default=list,
        help_text=_("XIDs seen since the previous reading."),
    )
    problems = _problems()
    instances = InstanceReadingSerializer(many=True, max_length=MAX_INSTANCES, required=False, default=list)


class ReadingSerializer(serializers.Serializer):
    host = serializers.CharField(max_length=253, help_text=_("The node's name, as the portal knows it."))
    at = AwareDateTimeField(help_text=_("When it was read, in ISO 8601 with the zone."))
    gpus = GpuReadingSerializer(many=True, required=False, default=list)
    problems = _problems()


class BatchSerializer(serializers.Serializer):
    """A batch of readings, oldest first. Its limits on readings and GPUs are the portal's settings
    MONITORING_BATCH_MAX_READINGS and MONITORING_BATCH_MAX_GPUS; past them the answer is 413."""

    readings = ReadingSerializer(many=True, allow_empty=False)


class AcceptedSerializer(serializers.Serializer):
    samples = serializers.IntegerField(
        help_text=_("Samples the batch carries, stored within seconds; one sent before is stored once.")
    )
    gpus = serializers.IntegerField(help_text=_("GPU readings taken in."))


class RefusalSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.ChoiceField(
        choices=[
            ("malformed", _("the body is not a JSON document")),
            ("invalid", _("wrong shapes, types or ranges: see `errors`")),
            (
                "out_of_bounds",
                _("readings too old or too far ahead: see `readings`; they never will be taken"),
            ),
            ("refused", _("an unknown host or GPU, or a GPU twice at one instant")),
            ("too_large", _("the body is larger than the portal takes")),
            ("too_many", _("more readings or GPUs than one batch may hold: send fewer at a time")),
            ("busy", _("more batches wait to be stored than the portal keeps: send this one again later")),
            ("unavailable", _("the portal's queue does not answer: send this batch again later")),
        ],
        required=False,
    )
    readings = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        help_text=_("With out_of_bounds: the positions in the batch of the readings outside the bounds."),
    )
    errors = serializers.DictField(
        required=False, help_text=_("With invalid: what is wrong, field by field.")
    )
