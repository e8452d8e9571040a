"""Alert rules fire once, resolve once and fire afresh when their condition comes back (thresholds and GPU
events here; silence and idle pools: test_alert_subjects.py); acknowledging. The helpers here (`node`,
`only`, `feed`) feed the other alert tests too."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from monitoring.alerts import services as alerts
from monitoring.collectors import GpuReading, InstanceReading, Reading
from monitoring.ingest.readings import ingest
from monitoring.models import Alert, AlertRule, GpuEvent
from portal.errors import Conflict
from tests.factories import (
    ClusterFactory,
    GpuCapacityFactory,
    NodeCapacityFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

NOW = datetime.now(UTC).replace(second=0, microsecond=0)
T0 = NOW - timedelta(hours=2)


def only(kind: str, **changes) -> AlertRule:
    """The default rule of `kind`, changed as asked; every other rule off, so evaluations see this one."""
    rule = AlertRule.objects.get(kind=kind)
    for name, value in changes.items():
        setattr(rule, name, value)
    rule.save()
    AlertRule.objects.exclude(pk=rule.pk).update(enabled=False)
    return rule


def reading(node, at, *, full=None, cut=None, instances=(None, None)) -> Reading:
    """One reading of the node's two GPUs: figures of the whole GPU 0 (`full`), of GPU 1 (`cut`) and of
    GPU 1's two MIG instances (`instances`), each a dict of figures."""
    gpu0, gpu1 = node.gpus.order_by("index")
    parts = tuple(
        InstanceReading(
            uuid=entry["uuid"],
            gpu_instance_id=n + 1,
            profile=entry["profile"],
            placement=(entry["start"], 4),
            memory_total_bytes=40 << 30,
            **(instances[n] or {}),
        )
        for n, entry in enumerate(gpu1.layout)
    )
    return Reading(
        host=node.name,
        at=at,
        gpus=(
            GpuReading(0, gpu0.uuid, **{"temperature_c": 60.0, "ecc_uncorrected": 0, **(full or {})}),
            GpuReading(1, gpu1.uuid, mig_enabled=True, instances=parts, **(cut or {})),
        ),
    )


def feed(node, start, end, *, step=30, **figures):
    """Readings every `step` seconds from `start` to `end` (both included)."""
    at = start
    while at <= end:
        ingest(cluster=node.cluster, readings=[reading(node, at, **figures)], source="agent", now=at)
        at += timedelta(seconds=step)


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def test_a_fresh_portal_has_the_default_rules():
    rules = {rule.kind: rule for rule in AlertRule.objects.all()}
    assert set(rules) == {"threshold", "ecc", "xid", "silent_node", "silent_agent", "idle_pool", "trespass"}
    hot = rules["threshold"]
    assert (hot.metric, hot.comparison, hot.threshold, hot.duration_seconds) == (
        "temperature_c",
        "above",
        85,
        300,
    )
    assert (rules["silent_node"].duration_seconds, rules["silent_agent"].duration_seconds) == (300, 600)
    assert (rules["idle_pool"].threshold, rules["idle_pool"].duration_seconds) == (5, 3600)
    assert (rules["trespass"].severity, rules["trespass"].duration_seconds) == ("critical", 60)
    assert all(rule.enabled for rule in rules.values())


# --- thresholds ----------------------------------------------------------------------------------


def test_a_temperature_over_the_threshold_for_the_duration_fires_once_and_resolves_once(node):
    rule = only("threshold")
    gpu0 = node.gpus.get(index=0)
    feed(node, T0, T0 + minutes(4), full={"temperature_c": 90.0})
    assert alerts.evaluate(now=T0 + minutes(4)).fired == 0  # hot, but not for five minutes yet

    feed(node, T0 + minutes(4.5), T0 + minutes(6), full={"temperature_c": 91.0})
    assert alerts.evaluate(now=T0 + minutes(6)).fired == 1
    assert alerts.evaluate(now=T0 + minutes(6)).fired == 0
    alert = Alert.objects.get(rule=rule)
    assert (alert.subject, alert.gpu, alert.value, alert.severity) == (
        f"gpu:{gpu0.pk}",
        gpu0,
        91.0,
        "warning",
    )
    assert "above 85 °C for 5 min" in alert.message and alert.resolved_at is None

    feed(node, T0 + minutes(6.5), T0 + minutes(6.5), full={"temperature_c": 70.0})
    assert alerts.evaluate(now=T0 + minutes(7)).resolved == 1
    assert alerts.evaluate(now=T0 + minutes(7)).resolved == 0
    alert.refresh_from_db()
    assert alert.resolved_at == T0 + minutes(7)

    feed(node, T0 + minutes(7), T0 + minutes(15), full={"temperature_c": 95.0})
    assert alerts.evaluate(now=T0 + minutes(13)).fired == 0  # the cool figure is still in the window
    result = alerts.evaluate(now=T0 + minutes(15))
    assert (result.fired, result.resolved) == (1, 0)
    assert Alert.objects.filter(rule=rule).count() == 2
    assert Alert.objects.filter(rule=rule).open().get().value == 95.0


@pytest.mark.parametrize(
    "gap_or_dip",
    [
        "one sample under the level",
        "samples only in the last minutes",
        "a gap longer than allowed",
        "samples that stopped",
    ],
)
def test_a_threshold_holds_only_when_every_sample_crosses_and_the_samples_cover_the_window(node, gap_or_dip):
    only("threshold")
    hot = {"full": {"temperature_c": 90.0}}
    end = T0 + minutes(10)
    if gap_or_dip == "one sample under the level":
        feed(node, T0, end - minutes(2.5), **hot)
        feed(node, end - minutes(2), end - minutes(2), full={"temperature_c": 80.0})
        feed(node, end - minutes(1.5), end, **hot)
    elif gap_or_dip == "samples only in the last minutes":
        feed(node, end - minutes(2), end, **hot)
    elif gap_or_dip == "a gap longer than allowed":
        feed(node, T0, end - minutes(4), **hot)
        feed(node, end - minutes(1), end, **hot)
    else:
        feed(node, T0, end - minutes(3), **hot)
    assert alerts.evaluate(now=end).fired == 0
    # With the window covered and every sample over, it fires: the cases above fail for their reason only.
    feed(node, end, end + minutes(6), **hot)
    assert alerts.evaluate(now=end + minutes(6)).fired == 1


def test_a_threshold_alert_stays_open_while_no_new_figure_says_it_is_over(node):
    only("threshold")
    feed(node, T0, T0 + minutes(6), full={"temperature_c": 90.0})
    alerts.evaluate(now=T0 + minutes(6))
    assert alerts.evaluate(now=T0 + minutes(30)).resolved == 0  # silent: the node rule's business
    assert Alert.objects.open().count() == 1


def test_memory_used_share_per_instance_fires_for_the_full_instance_only(node):
    rule = only("threshold", metric="memory_used_pct", threshold=90, scope="instance", name="Instance memory")
    gpu1 = node.gpus.get(index=1)
    full_instance = {"memory_used_bytes": 39 << 30, "sm_active_pct": 80.0}
    roomy_instance = {"memory_used_bytes": 1 << 30, "sm_active_pct": 80.0}
    feed(node, T0, T0 + minutes(6), instances=(full_instance, roomy_instance))

    assert alerts.evaluate(now=T0 + minutes(6)).fired == 1
    alert = Alert.objects.get(rule=rule)
    assert (alert.subject, alert.gpu, alert.slot) == (f"gpu:{gpu1.pk}:0", gpu1, 0)
    assert alert.value == pytest.approx(97.5)
    assert "MIG instance at slice 0" in alert.where


def test_a_below_threshold_watches_the_other_side(node):
    only("threshold", metric="sm_active_pct", comparison="below", threshold=10, scope="instance")
    feed(node, T0, T0 + minutes(6), instances=({"sm_active_pct": 2.0}, {"sm_active_pct": 50.0}))
    alerts.evaluate(now=T0 + minutes(6))
    assert list(Alert.objects.values_list("slot", flat=True)) == [0]


# --- events --------------------------------------------------------------------------------------


def test_an_uncorrected_ecc_error_fires_once_and_resolves_after_the_quiet_duration(node):
    rule = only("ecc")
    gpu0 = node.gpus.get(index=0)
    feed(node, T0, T0)
    feed(node, T0 + minutes(1), T0 + minutes(1), full={"ecc_uncorrected": 2})
    assert GpuEvent.objects.filter(kind="ecc").count() == 1

    assert alerts.evaluate(now=T0 + minutes(2)).fired == 1
    assert alerts.evaluate(now=T0 + minutes(3)).fired == 0
    alert = Alert.objects.get(rule=rule)
    assert (alert.subject, alert.severity, alert.value, alert.node) == (f"gpu:{gpu0.pk}", "critical", 2, node)

    assert alerts.evaluate(now=T0 + minutes(61)).resolved == 0  # an hour since the alert fired: not yet
    assert alerts.evaluate(now=T0 + minutes(62)).resolved == 1
    assert alerts.evaluate(now=T0 + minutes(63)).resolved == 0
    assert alerts.evaluate(now=T0 + minutes(64)).fired == 0  # the old event does not fire again

    feed(node, T0 + minutes(70), T0 + minutes(70), full={"ecc_uncorrected": 3})
    assert alerts.evaluate(now=T0 + minutes(71)).fired == 1
    assert Alert.objects.filter(rule=rule).count() == 2


def test_a_new_event_keeps_an_event_alert_open(node):
    only("ecc", duration_seconds=600)
    feed(node, T0, T0, full={"ecc_uncorrected": 1})
    alerts.evaluate(now=T0 + minutes(1))
    feed(node, T0 + minutes(8), T0 + minutes(8), full={"ecc_uncorrected": 4})
    assert alerts.evaluate(now=T0 + minutes(9)).fired == 0
    assert alerts.evaluate(now=T0 + minutes(12)).resolved == 0  # ten minutes since the newest error: not yet
    alert = Alert.objects.get()
    assert (alert.value, alert.last_seen_at) == (4, T0 + minutes(8))
    assert alerts.evaluate(now=T0 + minutes(18)).resolved == 1


@pytest.mark.parametrize(("xid", "severity"), [(13, "warning"), (79, "critical")])
def test_an_xid_fires_once_and_a_fatal_one_is_critical(node, xid, severity):
    rule = only("xid")
    feed(node, T0, T0, full={"xid_events": (xid,)})
    assert alerts.evaluate(now=T0 + minutes(1)).fired == 1
    assert alerts.evaluate(now=T0 + minutes(2)).fired == 0
    alert = Alert.objects.get(rule=rule)
    assert (alert.severity, alert.value) == (severity, xid)
    assert f"XID {xid}" in alert.message


def test_a_fatal_xid_after_a_harmless_one_makes_the_open_alert_critical(node):
    only("xid")
    feed(node, T0, T0, full={"xid_events": (13,)})
    alerts.evaluate(now=T0 + minutes(1))
    feed(node, T0 + minutes(2), T0 + minutes(2), full={"xid_events": (48,)})
    alerts.evaluate(now=T0 + minutes(3))
    assert Alert.objects.get().severity == "critical"


def test_an_event_delivered_late_still_fires_and_stays_open_its_duration(node):
    only("xid", duration_seconds=600)
    feed(node, T0, T0, full={"xid_events": (31,)})  # buffered by the agent, arriving an hour late
    late = T0 + minutes(60)
    assert alerts.evaluate(now=late).fired == 1
    assert alerts.evaluate(now=late + minutes(9)).resolved == 0
    assert alerts.evaluate(now=late + minutes(10)).resolved == 1


# --- once, whatever runs at once -----------------------------------------------------------------


def test_the_database_allows_one_open_alert_per_rule_and_subject(node):
    rule = AlertRule.objects.get(kind="ecc")
    fields = {"rule": rule, "subject": "gpu:1", "message": "x", "severity": "warning"}
    Alert.objects.create(**fields, fired_at=T0, last_seen_at=T0, resolved_at=T0)
    Alert.objects.create(**fields, fired_at=T0, last_seen_at=T0)
    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(**fields, fired_at=T0, last_seen_at=T0)


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_evaluations_at_once_fire_one_alert_and_resolve_it_once():
    cluster = ClusterFactory(name="race")
    node = NodeCapacityFactory(cluster=cluster, name="gpu-node-1", gpu_model="H100-80GB")
    GpuCapacityFactory(node=node, index=0)
    GpuCapacityFactory(node=node, index=1, mig={"3g.40gb": 2})
    only("threshold")
    feed(node, T0, T0 + minutes(6), full={"temperature_c": 90.0})
    results, errors = [], []

    def race(now):
        start = threading.Barrier(4)

        def run():
            try:
                start.wait()
                results.append(alerts.evaluate(now=now))
            except Exception as error:  # reported below
                errors.append(error)
            finally:
                connection.close()

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    race(T0 + minutes(6))
    assert errors == []
    assert sum(r.fired for r in results) == 1 and Alert.objects.count() == 1
    feed(node, T0 + minutes(7), T0 + minutes(7), full={"temperature_c": 60.0})
    results.clear()
    race(T0 + minutes(7))
    assert errors == []
    assert sum(r.resolved for r in results) == 1
    assert Alert.objects.get().resolved_at == T0 + minutes(7)


def test_a_disabled_rule_resolves_its_open_alerts(node):
    rule = only("threshold")
    feed(node, T0, T0 + minutes(6), full={"temperature_c": 90.0})
    alerts.evaluate(now=T0 + minutes(6))
    rule.enabled = False
    rule.save()
    assert alerts.evaluate(now=T0 + minutes(7)).resolved == 1


# --- acknowledging -------------------------------------------------------------------------------


def test_acknowledging_keeps_the_alert_open_until_it_resolves_twice_is_harmless_after_is_refused(node):
    only("threshold")
    operator = UserFactory(username="op", is_staff=True)
    feed(node, T0, T0 + minutes(6), full={"temperature_c": 90.0})
    alerts.evaluate(now=T0 + minutes(6))
    alert = Alert.objects.get()

    done = alerts.acknowledge(alert=alert, user=operator)
    assert (done.state, done.acknowledged_by) == ("acknowledged", operator)
    first = done.acknowledged_at
    other = UserFactory(username="op2", is_staff=True)
    again = alerts.acknowledge(alert=alert, user=other)
    assert (again.acknowledged_at, again.acknowledged_by) == (first, operator)
    assert alerts.evaluate(now=T0 + minutes(6)).resolved == 0

    feed(node, T0 + minutes(7), T0 + minutes(7), full={"temperature_c": 60.0})
    assert alerts.evaluate(now=T0 + minutes(7)).resolved == 1
    alert.refresh_from_db()
    assert alert.state == "resolved"
    with pytest.raises(Conflict, match="nothing left to acknowledge"):
        alerts.acknowledge(alert=alert, user=operator)
