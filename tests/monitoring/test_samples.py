"""Storage of samples: day partitions, 5-minute and 1-hour roll-ups (late samples included), pruning."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from monitoring.models import Rollup, RollupMark, Sample
from monitoring.storage import samples
from tests.factories import GpuCapacityFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


@pytest.fixture
def gpu():
    return GpuCapacityFactory()


def write(gpu, at, **figures):
    return samples.store([samples.Row(gpu.pk, -1, at, **figures)])


def test_each_day_gets_its_own_partition(gpu):
    write(gpu, T0, power_w=1.0)
    write(gpu, T0 + timedelta(days=1), power_w=2.0)

    assert {T0.date(), (T0 + timedelta(days=1)).date()} <= set(samples.partitions())
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {samples.partition_name(T0.date())}")
        assert cursor.fetchone() == (1,)


def test_five_minute_and_hourly_roll_ups_keep_min_avg_max(gpu):
    for minute, power in [(0, 100.0), (1, 300.0), (4, 200.0), (5, 400.0), (61, 50.0)]:
        write(gpu, T0 + timedelta(minutes=minute), power_w=power, memory_used_bytes=minute)

    written = samples.roll_up(now=T0 + timedelta(hours=2, minutes=1))

    first = Rollup.objects.get(gpu=gpu, seconds=300, bucket=T0)
    assert (first.samples, first.power_w_min, first.power_w_avg, first.power_w_max) == (
        3,
        100.0,
        200.0,
        300.0,
    )
    assert first.memory_used_bytes_max == 4
    hour = Rollup.objects.get(gpu=gpu, seconds=3600, bucket=T0)
    # Weighted by samples: (3 × 200 + 1 × 400) / 4.
    assert (hour.samples, hour.power_w_min, hour.power_w_avg, hour.power_w_max) == (4, 100.0, 250.0, 400.0)
    assert written == {300: 3, 3600: 2}


def test_a_run_that_finds_nothing_new_writes_nothing(gpu):
    write(gpu, T0, power_w=1.0)
    samples.roll_up(now=T0 + timedelta(hours=1))

    assert samples.roll_up(now=T0 + timedelta(hours=1)) == {300: 0, 3600: 0}


def test_late_samples_are_rolled_up_again(gpu):
    write(gpu, T0, power_w=100.0)
    samples.roll_up(now=T0 + timedelta(hours=1, minutes=1))
    assert RollupMark.objects.get(seconds=300).redo_from is None

    # An agent's buffer arrives after the portal was away: its own buckets are written again at once, and
    # no run is asked to redo the whole fleet's.
    write(gpu, T0 + timedelta(minutes=2), power_w=300.0)
    assert Rollup.objects.get(gpu=gpu, seconds=300, bucket=T0).power_w_avg == 200.0
    assert RollupMark.objects.get(seconds=300).redo_from is None
    samples.roll_up(now=T0 + timedelta(hours=1, minutes=2))

    assert Rollup.objects.get(gpu=gpu, seconds=300, bucket=T0).power_w_avg == 200.0
    assert Rollup.objects.get(gpu=gpu, seconds=3600, bucket=T0).power_w_max == 300.0


def test_pruning_drops_old_days_whole_and_old_roll_ups(gpu, settings):
    settings.MONITORING_RAW_DAYS = 2
    settings.MONITORING_5M_DAYS = 3
    for days in range(5):
        write(gpu, T0 + timedelta(days=days), power_w=float(days))
    samples.roll_up(now=T0 + timedelta(days=4, hours=1))
    now = T0 + timedelta(days=4, hours=1)

    pruned = samples.prune(now=now)

    kept = {row.at.date() for row in Sample.objects.all()}
    assert kept == {(T0 + timedelta(days=d)).date() for d in (2, 3, 4)}
    assert pruned.partitions == tuple(samples.partition_name((T0 + timedelta(days=d)).date()) for d in (0, 1))
    assert not Rollup.objects.filter(seconds=300, bucket__lt=now - timedelta(days=3)).exists()
    assert Rollup.objects.filter(seconds=3600, bucket__lt=now - timedelta(days=3)).exists()
    # Storing into a dropped day again makes its partition anew rather than failing.
    write(gpu, now, power_w=9.0)


def test_series_reads_raw_samples_for_short_spans_and_roll_ups_for_long_ones(gpu):
    now = T0 + timedelta(days=1)
    for minute in range(0, 120, 10):
        write(gpu, now - timedelta(minutes=minute), sm_active_pct=float(minute))
    samples.roll_up(now=now + timedelta(minutes=5))

    resolution, points = samples.series(
        metric="sm_active_pct",
        start=now - timedelta(hours=1),
        end=now + timedelta(minutes=1),
        gpu_ids=[gpu.pk],
        now=now,
    )
    assert resolution == 0
    assert [p.value for p in points] == [60.0, 50.0, 40.0, 30.0, 20.0, 10.0, 0.0]

    resolution, points = samples.series(
        metric="sm_active_pct", start=now - timedelta(days=1), end=now, gpu_ids=[gpu.pk], now=now
    )
    assert resolution == 300
    assert [p.value for p in points][-1] == 10.0


def test_a_run_leaves_the_bucket_that_ended_less_than_a_minute_ago(gpu):
    """A batch still in flight as a bucket ends is neither in it nor late: runs wait for it to settle."""
    write(gpu, T0 + timedelta(minutes=4, seconds=50), power_w=1.0)

    assert samples.roll_up(now=T0 + timedelta(minutes=5, seconds=30)) == {300: 0, 3600: 0}
    assert samples.roll_up(now=T0 + timedelta(minutes=6))[300] == 1


def test_a_late_sample_repairs_its_own_buckets_and_no_other(gpu):
    other = GpuCapacityFactory()
    for each in (gpu, other):
        write(each, T0, power_w=100.0)
    samples.roll_up(now=T0 + timedelta(hours=2))
    Rollup.objects.filter(gpu=other).update(power_w_max=-1.0)  # what a repair of the fleet would undo

    write(gpu, T0 + timedelta(minutes=1), power_w=300.0)

    five, hour = (Rollup.objects.get(gpu=gpu, seconds=s, bucket=T0) for s in (300, 3600))
    assert (five.samples, five.power_w_avg, five.power_w_max) == (2, 200.0, 300.0)
    assert (hour.samples, hour.power_w_avg, hour.power_w_max) == (2, 200.0, 300.0)
    assert set(Rollup.objects.filter(gpu=other).values_list("power_w_max", flat=True)) == {-1.0}
    assert not RollupMark.objects.exclude(redo_from=None).exists()


def test_fresh_samples_read_no_mark_and_old_ones_lock_the_marks(gpu, django_assert_num_queries):
    write(gpu, T0, power_w=1.0)
    samples.roll_up(now=T0 + timedelta(hours=1))
    fresh = datetime.now(UTC).replace(microsecond=0)
    samples.ensure_partitions([fresh.date()])
    samples.store([samples.Row(gpu.pk, -1, fresh, power_w=1.0)])  # the day's partition is made and seen

    with django_assert_num_queries(1):  # the insert alone
        samples.store([samples.Row(gpu.pk, -1, fresh + timedelta(seconds=15), power_w=2.0)])
    with django_assert_num_queries(2) as old:  # the insert, and the marks under a share lock
        samples.store([samples.Row(gpu.pk, -1, fresh - timedelta(minutes=5), power_w=3.0)])
    assert "FOR SHARE" in old.captured_queries[1]["sql"]


def test_new_samples_go_in_by_copy_and_a_stored_one_is_told(gpu):
    row = (gpu.pk, -1, T0, 1.0, None, None, None, None, None, None, None)
    with transaction.atomic():
        assert samples.store_values([row], new=True) == 1
    assert Sample.objects.get().power_w == 1.0

    with pytest.raises(samples.StoredBefore), transaction.atomic():
        samples.store_values([row, (gpu.pk, -1, T0 + timedelta(seconds=15), *row[3:])], new=True)
    assert Sample.objects.count() == 1  # the batch, lost whole
    assert samples.store_values([row, (gpu.pk, -1, T0 + timedelta(seconds=15), *row[3:])]) == 1


def test_a_partition_made_by_a_transaction_rolled_back_is_made_again(gpu):
    day = T0 + timedelta(days=40)
    with pytest.raises(RuntimeError), transaction.atomic():
        write(gpu, day, power_w=1.0)
        raise RuntimeError("the batch fails after its samples were written")

    assert write(gpu, day, power_w=2.0) == 1
