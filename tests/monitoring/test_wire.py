"""The wire format of readings: what the agent writes, the portal reads back unchanged."""

import json
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.collectors.wire import from_json, to_json

texts = st.text(max_size=12)
figures = st.none() | st.floats(0, 1000, allow_nan=False)
counts = st.none() | st.integers(0, 2**53)
instances = st.builds(
    InstanceReading,
    uuid=texts,
    gpu_instance_id=st.integers(-1, 14),
    profile=st.none() | texts,
    placement=st.none() | st.tuples(st.integers(0, 7), st.integers(1, 8)),
    memory_used_bytes=counts,
    memory_total_bytes=counts,
    sm_active_pct=figures,
    problems=st.lists(texts, max_size=3).map(tuple),
)
gpus = st.builds(
    GpuReading,
    index=st.integers(0, 15),
    uuid=texts,
    model=st.none() | texts,
    mig_enabled=st.none() | st.booleans(),
    power_w=figures,
    temperature_c=figures,
    utilisation_pct=figures,
    sm_active_pct=figures,
    memory_used_bytes=counts,
    memory_total_bytes=counts,
    ecc_corrected=counts,
    ecc_uncorrected=counts,
    xid_events=st.lists(st.integers(0, 200), max_size=3).map(tuple),
    instances=st.lists(instances, max_size=3).map(tuple),
    problems=st.lists(texts, max_size=3).map(tuple),
)
readings = st.builds(
    Reading,
    host=texts,
    at=st.datetimes(timezones=st.sampled_from([UTC, datetime.now().astimezone().tzinfo])),
    gpus=st.lists(gpus, max_size=3).map(tuple),
    problems=st.lists(texts, max_size=2).map(tuple),
)


@given(reading=readings)
def test_a_reading_comes_back_from_its_json_unchanged(reading):
    assert from_json(json.loads(json.dumps(to_json(reading), allow_nan=False))) == reading


def test_a_figure_that_is_not_a_number_travels_as_null():
    odd = Reading("h", datetime(2026, 5, 1, tzinfo=UTC), (GpuReading(0, "GPU-0", power_w=float("nan")),))
    assert json.loads(json.dumps(to_json(odd), allow_nan=False))["gpus"][0]["power_w"] is None
