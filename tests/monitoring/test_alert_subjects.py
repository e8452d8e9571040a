"""Alert rules about more than a GPU: a node or an agent gone silent, a billed pool left idle. Each fires once
and resolves once its condition is over."""

import pytest
from django.db.backends.postgresql.psycopg_any import NumericRange

from monitoring.alerts import services as alerts
from monitoring.models import Alert
from pools.models import PoolState
from tests.factories import AllocationFactory, NodeCapacityFactory, PoolFactory
from tests.monitoring import test_alerts as rules

pytestmark = pytest.mark.django_db

only, feed, minutes, T0 = rules.only, rules.feed, rules.minutes, rules.T0


# --- silence -------------------------------------------------------------------------------------


def test_a_silent_node_fires_once_and_resolves_when_it_reports_again(node):
    rule = only("silent_node")
    NodeCapacityFactory(cluster=node.cluster, name="never-reported", gpus=1)
    feed(node, T0, T0)
    assert alerts.evaluate(now=T0 + minutes(4)).fired == 0
    assert alerts.evaluate(now=T0 + minutes(6)).fired == 1
    assert alerts.evaluate(now=T0 + minutes(7)).fired == 0
    alert = Alert.objects.get(rule=rule)
    assert (alert.subject, alert.node, alert.severity) == (f"node:{node.pk}", node, "critical")
    assert "sim/gpu-node-1" in alert.message

    feed(node, T0 + minutes(8), T0 + minutes(8))
    assert alerts.evaluate(now=T0 + minutes(9)).resolved == 1
    assert alerts.evaluate(now=T0 + minutes(20)).fired == 1  # silent again: a new alert
    assert Alert.objects.filter(rule=rule).count() == 2


def test_a_node_that_left_the_cluster_resolves_its_silence(node):
    only("silent_node")
    feed(node, T0, T0)
    alerts.evaluate(now=T0 + minutes(6))
    node.present = False
    node.save()
    assert alerts.evaluate(now=T0 + minutes(7)).resolved == 1


def test_a_silent_agent_fires_once_and_resolves_when_used_or_revoked(node):
    from monitoring.ingest.tokens import issue_agent_token, revoke_agent_token
    from monitoring.models import AgentToken

    rule = only("silent_agent")
    used = issue_agent_token(cluster=node.cluster, name="node-1").token
    issue_agent_token(cluster=node.cluster, name="never-used")
    AgentToken.objects.filter(pk=used.pk).update(last_used_at=T0, last_host="gpu-node-1")

    assert alerts.evaluate(now=T0 + minutes(9)).fired == 0
    assert alerts.evaluate(now=T0 + minutes(11)).fired == 1
    assert alerts.evaluate(now=T0 + minutes(12)).fired == 0
    alert = Alert.objects.get(rule=rule)
    assert (alert.subject, alert.agent_token) == (f"agent:{used.pk}", used)
    assert "sim: node-1" in alert.message and "gpu-node-1" in alert.message

    AgentToken.objects.filter(pk=used.pk).update(last_used_at=T0 + minutes(13))
    assert alerts.evaluate(now=T0 + minutes(14)).resolved == 1
    assert alerts.evaluate(now=T0 + minutes(30)).fired == 1
    revoke_agent_token(token=used)
    assert alerts.evaluate(now=T0 + minutes(31)).resolved == 1
    assert alerts.evaluate(now=T0 + minutes(60)).fired == 0


# --- idle pools ----------------------------------------------------------------------------------


@pytest.fixture
def pools(node):
    """An idle pool holding GPU 0 whole and GPU 1's first instance, and a busy one holding the second."""
    gpu0, gpu1 = node.gpus.order_by("index")
    idle = PoolFactory(cluster=node.cluster, reserved_at=T0 - minutes(60))
    busy = PoolFactory(cluster=node.cluster, reserved_at=T0 - minutes(60))
    AllocationFactory(pool=idle, gpu=gpu0)
    AllocationFactory(pool=idle, gpu=gpu1, profile="3g.40gb", slices=NumericRange(0, 4))
    AllocationFactory(pool=busy, gpu=gpu1, profile="3g.40gb", slices=NumericRange(4, 8))
    idle.allocations.update(allocated_at=T0 - minutes(60))
    busy.allocations.update(allocated_at=T0 - minutes(60))
    return idle, busy


def quiet(sm_idle=2.0, sm_busy=60.0, sm_gpu0=1.0):
    return {
        "full": {"sm_active_pct": sm_gpu0},
        "instances": ({"sm_active_pct": sm_idle}, {"sm_active_pct": sm_busy}),
    }


def test_a_billed_pool_idle_for_the_duration_fires_once_and_resolves_when_used(node, pools):
    idle, _busy = pools
    rule = only("idle_pool", duration_seconds=600)
    feed(node, T0, T0 + minutes(9), step=60, **quiet())
    assert alerts.evaluate(now=T0 + minutes(9)).fired == 0
    feed(node, T0 + minutes(10), T0 + minutes(11), step=60, **quiet())
    assert alerts.evaluate(now=T0 + minutes(11)).fired == 1
    assert alerts.evaluate(now=T0 + minutes(11)).fired == 0
    alert = Alert.objects.get(rule=rule)
    assert (alert.subject, alert.pool, alert.value) == (f"pool:{idle.pk}", idle, 2.0)
    assert "2 allocation(s)" in alert.message

    feed(node, T0 + minutes(12), T0 + minutes(12), **quiet(sm_idle=40.0))
    assert alerts.evaluate(now=T0 + minutes(12)).resolved == 1
    feed(node, T0 + minutes(13), T0 + minutes(25), step=60, **quiet())
    assert alerts.evaluate(now=T0 + minutes(23)).fired == 0  # the busy minute is still in the window
    assert alerts.evaluate(now=T0 + minutes(25)).fired == 1
    assert list(Alert.objects.filter(rule=rule).values_list("pool", flat=True)) == [idle.pk, idle.pk]


def test_a_pool_is_idle_only_when_every_allocation_is(node, pools):
    only("idle_pool", duration_seconds=600)
    feed(node, T0, T0 + minutes(11), step=60, **quiet(sm_gpu0=30.0))
    assert alerts.evaluate(now=T0 + minutes(11)).fired == 0


def test_an_allocation_younger_than_the_duration_is_not_idle_yet(node, pools):
    idle, _busy = pools
    only("idle_pool", duration_seconds=600)
    idle.allocations.filter(profile="full").update(allocated_at=T0 + minutes(5))
    feed(node, T0, T0 + minutes(11), step=60, **quiet())
    assert alerts.evaluate(now=T0 + minutes(11)).fired == 0
    assert alerts.evaluate(now=T0 + minutes(11)).fired == 0
    feed(node, T0 + minutes(12), T0 + minutes(16), step=60, **quiet())
    assert alerts.evaluate(now=T0 + minutes(16)).fired == 1


def test_a_released_pool_resolves_its_idle_alert(node, pools):
    idle, _busy = pools
    only("idle_pool", duration_seconds=600)
    feed(node, T0, T0 + minutes(11), step=60, **quiet())
    alerts.evaluate(now=T0 + minutes(11))
    idle.state, idle.released_at = PoolState.RELEASED, T0 + minutes(11)
    idle.save()
    assert alerts.evaluate(now=T0 + minutes(12)).resolved == 1
