"""A Celery round trip through Redis with a real worker process (no eager mode)."""

import time

import pytest

from portal.models import Role
from portal.services import invite_member
from portal.tasks import send_invitation
from tests.conftest import HELD_QUEUE, TASK_QUEUE
from tests.factories import MembershipFactory, TenantFactory


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
