"""A Celery round trip through Redis with a real worker process (no eager mode), wherever the apps route
each task; and what a test that does not ask for the worker sends, held back."""

import time

import pytest

from billing.tasks import meter_usage
from monitoring.tasks import roll_up_samples
from pools.tasks import admit_waiting_requests, execute_whatif_run, sync_all_clusters
from portal import shell
from portal.celery import route_to_own_queue
from portal.models import Role
from portal.services import invite_member
from portal.tasks import send_invitation
from tests.conftest import HELD_QUEUE, TASK_QUEUE
from tests.factories import ClusterFactory, MembershipFactory, TenantFactory


def wait_until(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the worker"
        time.sleep(0.2)


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_invitation_email_is_sent_by_the_worker(celery_worker):
    tenant = TenantFactory(slug="acme", name="Acme")
    admin = MembershipFactory(tenant=tenant, role=Role.ADMIN).user

    invitation = invite_member(tenant=tenant, actor=admin, email="worker@example.com")

    def sent():
        invitation.refresh_from_db()
        return invitation.sent_at is not None

    wait_until(sent)
    mails = [
        m for m in (p.read_text() for p in celery_worker.mail_dir.iterdir()) if "worker@example.com" in m
    ]
    assert len(mails) == 1
    assert "worker@example.com" in mails[0] and invitation.token in mails[0]

    # A duplicate delivery is answered through the result backend and sends nothing more.
    assert send_invitation.delay(invitation.pk).get(timeout=30) == "already sent"
    assert sum("worker@example.com" in p.read_text() for p in celery_worker.mail_dir.iterdir()) == 1


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_a_test_that_does_not_ask_for_the_worker_sends_it_nothing(_session_worker):
    """The session's worker is up (an earlier test started it), but this test does not ask for it: what
    it sends waits where no worker takes it, so that no task acts on the database under the test."""
    from portal.celery import app

    tenant = TenantFactory(slug="acme", name="Acme")
    admin = MembershipFactory(tenant=tenant, role=Role.ADMIN).user
    invitation = invite_member(tenant=tenant, actor=admin, email="held@example.com")
    with app.connection_for_read() as broker:
        redis = broker.default_channel.client
        assert (redis.llen(HELD_QUEUE), redis.llen(TASK_QUEUE)) == (1, 0)
    invitation.refresh_from_db()
    assert invitation.sent_at is None


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_sessions_worker_takes_every_task_whatever_queue_its_app_routes_it_to(celery_worker):
    """One task of each queue the apps route to: sent by the test, and sent on by the worker (a sync of
    every cluster queues each cluster's sync, which queues a queue run), each reaches the session's worker."""
    sent = (admit_waiting_requests, sync_all_clusters, roll_up_samples, meter_usage, execute_whatif_run)
    routed = {route_to_own_queue(task.name, (), {}, {})["queue"] for task in sent}
    assert routed == {route["queue"] for route in shell.task_routes().values()}  # one of each
    cluster = ClusterFactory(name="routed", fleet=[("h100", 1, "H100-80GB", [None] * 8)])

    assert admit_waiting_requests.delay().get(timeout=30) == "0 admitted, 0 waiting"
    assert sync_all_clusters.delay().get(timeout=30) == 1
    wait_until(lambda: cluster.nodes.exists())  # the cluster's own sync, which the worker sent on
    assert isinstance(roll_up_samples.delay().get(timeout=30), str)
    assert meter_usage.delay().get(timeout=30) == "nothing to meter"
    assert execute_whatif_run.delay(0).get(timeout=30) == "gone"


def test_what_a_test_without_the_worker_sends_is_held_back_whatever_its_route():
    """Every task an app routes to a queue of its own waits on the held queue, as the others do: none on the
    session's queue, none on the queues production would send it to."""
    from portal.celery import app

    routes = shell.task_routes()
    for task in routes:
        app.send_task(task, args=[0])
    with app.connection_for_read() as broker:
        redis = broker.default_channel.client
        assert redis.llen(HELD_QUEUE) == len(routes)
        assert redis.llen(TASK_QUEUE) == 0
        assert not any(redis.llen(route["queue"]) for route in routes.values())
