"""E-mails about requests and pools: one per event that matters, to who asked, unless they opted out."""

import re

from django.core import mail
from django.urls import reverse

from pools.apps import EMAIL_TOPIC
from pools.models import PoolEvent
from pools.notifications import send_event_email
from pools.services import approve_request, reject_request, submit_request
from portal.models import Preferences


def test_a_decision_is_e_mailed_once_to_who_asked(
    sim_cluster, tenancy, staff_user, django_capture_on_commit_callbacks
):
    from pools.services.inventory import sync_inventory

    sync_inventory(cluster=sim_cluster)
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    with django_capture_on_commit_callbacks() as callbacks:
        reject_request(request_id=request.pk, approver=staff_user("approver"), reason="no budget left")
    assert len(callbacks) == 1  # the e-mail is queued after the decision is committed
    event = PoolEvent.objects.get(request=request, to_state="rejected")
    assert send_event_email(event.pk) == "sent"
    assert send_event_email(event.pk) == "already sent"  # a redelivered task
    (sent,) = mail.outbox
    assert sent.to == [tenancy.acme_member.email]
    assert f"#{request.pk}" in sent.subject and "rejected" in sent.subject
    assert "no budget left" in sent.body
    assert reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": request.pk}) in sent.body


def test_people_who_opted_out_get_nothing(sim_cluster, tenancy, staff_user, client):
    from pools.services.inventory import sync_inventory

    sync_inventory(cluster=sim_cluster)
    client.force_login(tenancy.acme_member)
    assert client.post(reverse("preferences"), {}).status_code == 302  # the box unticked
    assert not Preferences.wants_email(tenancy.acme_member, EMAIL_TOPIC)
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    approve_request(request_id=request.pk, approver=staff_user("approver"))
    event = PoolEvent.objects.get(request=request, to_state="approved")
    assert send_event_email(event.pk) == "not wanted"
    assert mail.outbox == []
    page = client.get(reverse("preferences")).content.decode()
    assert "checked" not in page.split(f'name="email_{EMAIL_TOPIC}"')[1][:80]
    assert client.post(reverse("preferences"), {f"email_{EMAIL_TOPIC}": "on"}).status_code == 302
    assert Preferences.wants_email(tenancy.acme_member, EMAIL_TOPIC)


def test_events_nobody_needs_to_hear_about_send_nothing(
    sim_cluster, tenancy, django_capture_on_commit_callbacks
):
    from pools.services.inventory import sync_inventory

    sync_inventory(cluster=sim_cluster)
    with django_capture_on_commit_callbacks() as callbacks:
        submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    assert callbacks == []  # one's own submission is no news


def test_a_pool_e_mail_is_in_the_askers_language(sim_cluster, tenancy, staff_user):
    from pools.services.inventory import sync_inventory

    sync_inventory(cluster=sim_cluster)
    Preferences.objects.create(user=tenancy.acme_member, language="ko")
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    reject_request(request_id=request.pk, approver=staff_user("approver"), reason="예산 부족")
    assert send_event_email(PoolEvent.objects.get(request=request, to_state="rejected").pk) == "sent"
    (sent,) = mail.outbox
    assert re.search("[가-힣]", sent.subject) and "rejected" not in sent.subject
