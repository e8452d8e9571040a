"""Readings into storage: samples, newest figures, events, instance binding; refusals that store nothing."""

import gc
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DataError, connection

from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.ingest.readings import ingest
from monitoring.models import GpuEvent, Latest, Sample
from monitoring.storage import samples
from portal.errors import InvalidInput
from tests.factories import AllocationFactory, GpuCapacityFactory, NodeCapacityFactory

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(microsecond=0)


def reading(node, *, at=NOW, host=None, **figures):
    full, cut = node.gpus.order_by("index")
    instances = tuple(
        InstanceReading(
            uuid=entry["uuid"],
            gpu_instance_id=n + 1,
            profile=entry["profile"],
            placement=(entry["start"], 4),
            memory_used_bytes=1 << 30,
            memory_total_bytes=40 << 30,
            sm_active_pct=30.0 + n,
        )
        for n, entry in enumerate(cut.layout)
    )
    return Reading(
        host=host or node.name,
        at=at,
        gpus=(
            GpuReading(
                0, full.uuid, **{"power_w": 300.0, "temperature_c": 60.0, "ecc_uncorrected": 0, **figures}
            ),
            GpuReading(1, cut.uuid, mig_enabled=True, power_w=200.0, instances=instances),
        ),
    )


def test_a_reading_stores_a_sample_per_gpu_and_instance(node):
    result = ingest(cluster=node.cluster, readings=[reading(node)], source="agent")

    full, cut = node.gpus.order_by("index")
    assert result.samples == 4
    assert Sample.objects.filter(gpu=full, slot=-1).get().power_w == 300.0
    assert sorted(Sample.objects.filter(gpu=cut).values_list("slot", "sm_active_pct")) == [
        (-1, None),
        (0, 30.0),
        (4, 31.0),
    ]
    assert Latest.objects.get(gpu=cut, slot=4).profile == "3g.40gb"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_no_statement_of_a_batch_is_compiled_and_the_setting_ends_with_it(node):
    """PostgreSQL's JIT would spend longer compiling a writer's read of 2,000 hosts than running it; the
    rest of the connection's work keeps the server's setting."""

    def jit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW jit")
            return cursor.fetchone()[0]

    before = jit()
    during = []
    ingest(cluster=node.cluster, readings=[reading(node)], source="agent", also=lambda: during.append(jit()))
    assert during == ["off"]
    assert jit() == before


def test_the_cycle_collector_is_off_for_a_batch_and_as_it_was_after(node):
    """A writer's round holds a few objects per sample until it ends; the collector set off by them again and
    again cost a quarter of the writer's time."""
    during = []
    ingest(
        cluster=node.cluster,
        readings=[reading(node)],
        source="agent",
        also=lambda: during.append(gc.isenabled()),
    )
    assert during == [False]
    assert gc.isenabled()

    with pytest.raises(InvalidInput):
        ingest(cluster=node.cluster, readings=[reading(node, host="elsewhere")], source="agent")
    assert gc.isenabled()  # on again after a refusal too

    gc.disable()  # a process that keeps it off finds it off
    try:
        ingest(cluster=node.cluster, readings=[reading(node, at=NOW - timedelta(seconds=15))], source="agent")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_same_batch_twice_is_stored_once(node):
    ingest(cluster=node.cluster, readings=[reading(node)], source="agent")
    again = ingest(cluster=node.cluster, readings=[reading(node)], source="agent")

    assert again.samples == 0
    assert Sample.objects.count() == 4


def test_newest_figures_never_go_back_in_time(node):
    ingest(cluster=node.cluster, readings=[reading(node, temperature_c=None)], source="agent")
    ingest(cluster=node.cluster, readings=[reading(node, at=NOW - timedelta(minutes=1))], source="agent")

    full = node.gpus.get(index=0)
    assert Latest.objects.get(gpu=full, slot=-1).at == NOW
    assert Sample.objects.filter(gpu=full).count() == 2


@pytest.mark.parametrize(
    "change, why",
    [
        ({"host": "elsewhere"}, "elsewhere is not a node of cluster sim"),
        ({"at": NOW + timedelta(hours=1)}, "outside"),
        ({"at": NOW - timedelta(days=2)}, "outside"),
    ],
)
def test_an_unknown_host_or_a_time_out_of_bounds_refuses_the_batch(node, change, why):
    good = reading(node)
    with pytest.raises(InvalidInput, match=why):
        ingest(cluster=node.cluster, readings=[good, reading(node, **change)], source="agent")

    assert not Sample.objects.exists()
    assert not Latest.objects.exists()


def test_an_unknown_gpu_refuses_the_batch_unless_not_strict(node):
    stranger = Reading(node.name, NOW, (GpuReading(7, "GPU-nobody"),))

    with pytest.raises(InvalidInput, match="has no GPU GPU-nobody"):
        ingest(cluster=node.cluster, readings=[reading(node), stranger], source="agent")
    assert not Sample.objects.exists()

    result = ingest(cluster=node.cluster, readings=[reading(node), stranger], source="dcgm", strict=False)
    assert result.samples == 4
    assert any("GPU-nobody" in problem for problem in result.problems)


def test_xids_a_rise_of_uncorrected_ecc_and_a_missing_gpu_are_events_once(node):
    full, cut = node.gpus.order_by("index")
    ingest(cluster=node.cluster, readings=[reading(node)], source="agent")
    later = NOW + timedelta(seconds=15)
    ingest(
        cluster=node.cluster,
        readings=[reading(node, at=later, ecc_uncorrected=2, xid_events=(48,))],
        source="agent",
    )
    only_full = Reading(
        node.name, later + timedelta(seconds=15), (GpuReading(0, full.uuid, ecc_uncorrected=2),)
    )
    ingest(cluster=node.cluster, readings=[only_full], source="agent")
    again = Reading(node.name, later + timedelta(seconds=30), (GpuReading(0, full.uuid, ecc_uncorrected=2),))
    ingest(cluster=node.cluster, readings=[again], source="agent")

    events = sorted(GpuEvent.objects.values_list("gpu_id", "kind", "code"))
    assert events == [(full.pk, "ecc", 2), (full.pk, "xid", 48), (cut.pk, "lost", None)]


def test_instance_uuids_bind_to_allocations_and_a_foreign_layout_is_flagged(node):
    cut = node.gpus.get(index=1)
    allocation = AllocationFactory(gpu=cut, profile="3g.40gb", instance_uuid="")
    ingest(cluster=node.cluster, readings=[reading(node)], source="agent")

    allocation.refresh_from_db()
    assert allocation.instance_uuid == next(
        e["uuid"] for e in cut.layout if e["start"] == allocation.slices.lower
    )
    assert not GpuEvent.objects.filter(kind="layout").exists()

    odd = Reading(
        node.name,
        NOW + timedelta(seconds=15),
        (
            GpuReading(
                1, cut.uuid, mig_enabled=True, instances=(InstanceReading("MIG-x", 1, "7g.80gb", (0, 8)),)
            ),
        ),
    )
    ingest(cluster=node.cluster, readings=[odd], source="agent", strict=False)
    ingest(
        cluster=node.cluster,
        readings=[odd.__class__(odd.host, odd.at + timedelta(seconds=15), odd.gpus)],
        source="agent",
        strict=False,
    )
    [event] = GpuEvent.objects.filter(kind="layout")
    assert "7g.80gb@0" in event.detail and "3g.40gb@4" in event.detail


def test_a_last_xid_gauge_records_a_new_xid_once(node):
    full = node.gpus.get(index=0)
    for n, xid in enumerate([79, 79, 79, 13, 13]):
        at = NOW + timedelta(seconds=15 * n)
        gpu = GpuReading(0, full.uuid, xid_events=(xid,))
        ingest(cluster=node.cluster, readings=[Reading(node.name, at, (gpu,))], source="dcgm", strict=False)

    assert list(GpuEvent.objects.filter(kind="xid").order_by("at").values_list("code", flat=True)) == [79, 13]


def test_a_failure_after_the_samples_are_written_leaves_nothing_behind(node):
    """Samples, newest figures and events go in one transaction: here the newest figures cannot be written
    (a profile longer than its column), after the samples were copied in and with an event to record."""
    full, cut = node.gpus.order_by("index")
    odd = InstanceReading("MIG-x", 1, "p" * 40, (0, 4), 1 << 30, 40 << 30, 30.0)
    bad = Reading(
        node.name,
        NOW,
        (
            GpuReading(0, full.uuid, xid_events=(79,)),
            GpuReading(1, cut.uuid, mig_enabled=True, instances=(odd,)),
        ),
    )
    with pytest.raises(DataError):
        ingest(cluster=node.cluster, readings=[bad], source="agent")

    assert not Sample.objects.exists() and not Latest.objects.exists() and not GpuEvent.objects.exists()


def test_what_runs_with_the_batch_fails_it_whole(node):
    def fail():
        raise RuntimeError("after everything was written")

    with pytest.raises(RuntimeError):
        ingest(cluster=node.cluster, readings=[reading(node, xid_events=(79,))], source="agent", also=fail)

    assert not Sample.objects.exists() and not Latest.objects.exists() and not GpuEvent.objects.exists()


def test_a_batch_whose_samples_are_partly_stored_is_stored_for_the_rest(node):
    full = node.gpus.get(index=0)
    samples.store([samples.Row(full.pk, -1, NOW, power_w=1.0)])  # not through ingest: no newest figures

    result = ingest(cluster=node.cluster, readings=[reading(node, xid_events=(79,))], source="agent")

    assert result.samples == 3 and len(result.events) == 1
    assert Sample.objects.count() == 4 and Latest.objects.count() == 4
    assert Sample.objects.get(gpu=full).power_w == 1.0 and Latest.objects.get(gpu=full).power_w == 300.0


def test_a_resent_reading_beside_new_ones_costs_only_its_own_rows(node, monkeypatch):
    """A writer's round holds many agents' readings; one agent's resend must not send them all down the
    path that passes over what is stored, which costs several times as much a row."""
    other = NodeCapacityFactory(cluster=node.cluster, name="gpu-node-2", gpu_model="H100-80GB")
    GpuCapacityFactory(node=other, index=0)
    first = reading(node, at=NOW - timedelta(seconds=15))
    ingest(cluster=node.cluster, readings=[first], source="agent")
    calls = []
    store_values = samples.store_values
    monkeypatch.setattr(
        samples,
        "store_values",
        lambda values, *, new: calls.append((len(values), new)) or store_values(values, new=new),
    )
    newcomer = Reading(other.name, NOW, (GpuReading(0, other.gpus.get().uuid, power_w=100.0),))

    result = ingest(
        cluster=node.cluster, readings=[first, reading(node), newcomer], source="agent", strict=False
    )

    assert calls == [(5, True), (4, False)]  # the resent reading's 4 rows alone passed over what is stored
    assert result.samples == 5
    assert Sample.objects.count() == 9


def test_a_batch_of_several_hosts_is_taken_whole(node):
    other = NodeCapacityFactory(cluster=node.cluster, name="gpu-node-2", gpu_model="H100-80GB")
    GpuCapacityFactory(node=other, index=0)
    first, second = reading(node), Reading(other.name, NOW, (GpuReading(0, other.gpus.get().uuid),))

    result = ingest(cluster=node.cluster, readings=[first, second], source="agent")

    assert result.samples == 5 and result.gpus == 3


def test_figures_that_are_no_numbers_are_stored_as_unknown(node):
    odd = reading(node, power_w=float("nan"), temperature_c=float("inf"))
    ingest(cluster=node.cluster, readings=[odd], source="dcgm", strict=False)

    full = node.gpus.get(index=0)
    assert Sample.objects.filter(gpu=full).values_list("power_w", "temperature_c").get() == (None, None)
    assert Latest.objects.filter(gpu=full, slot=-1).values_list("power_w", "temperature_c").get() == (
        None,
        None,
    )
