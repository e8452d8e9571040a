"""Who hears of a GPU fault, and how: through the notifications every alert goes through (each sent once,
retried, failing alone), one e-mail per person for a fatal XID however many roles they hold, the pools'
people of their own pools, the approvers of all, each only while they want the topic."""

import smtplib
from datetime import timedelta

from django.contrib.auth.models import Group
from django.core import mail
from django.core.mail.backends import locmem
from django.urls import reverse
from django.utils import timezone

from monitoring.alerts import services as alerts
from monitoring.apps import FAULT_EMAIL_TOPIC
from monitoring.models import Alert, AlertRule, Delivery, GpuFault
from monitoring.notifications import sending
from portal.models import Preferences
from portal.roles import PlatformRole
from tests.factories import UserFactory
from tests.monitoring.test_faults import fleet, gpu_of, push, report  # noqa: F401 (fleet: a fixture)
from tests.pools.test_replacement import active_pool


class RefusesOnce(locmem.EmailBackend):
    """A mail server that turns away the first message to each address of `refusing`, then takes them."""

    refusing: set[str] = set()

    def send_messages(self, messages):
        for message in messages:
            refused = self.refusing.intersection(message.to)
            if refused:
                self.refusing.difference_update(refused)
                busy = (450, b"mailbox busy, try again later")
                raise smtplib.SMTPRecipientsRefused(dict.fromkeys(refused, busy))
        return super().send_messages(messages)


def tell(now=None) -> sending.Delivered:
    """What follows a fault: the alert evaluation sent for when it opens, then the sending."""
    alerts.evaluate(now=now)
    return sending.deliver_due(now=now)


def addressed() -> list[str]:
    """Who got e-mails, one entry per e-mail; each e-mail goes to one address."""
    assert all(len(message.to) == 1 for message in mail.outbox)
    return sorted(message.to[0] for message in mail.outbox)


def xid(cluster, gpu, code=79):
    push(cluster, report(gpu.node.name, **{f"g{gpu.index}": {"xid_events": (code,)}}))


def test_the_pools_people_and_the_approvers_hear_of_a_fault_once(fleet, tenancy, approver):  # noqa: F811
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    gpu = gpu_of(pool)
    push(fleet, report("h100-1"))  # the count the GPU starts from
    push(fleet, report("h100-1", seconds=15, **{f"g{gpu.index}": {"ecc_uncorrected": 2}}))

    assert tell().sent == 3
    assert tell().sent == 0  # a second evaluation, a task delivered twice: nothing new

    member, admin = tenancy.acme_member, tenancy.acme_admin
    assert addressed() == sorted([member.email, admin.email, approver.email])
    sent = {message.to[0]: message for message in mail.outbox}
    for person in (member, admin):
        assert f"#{pool.pk}" in sent[person.email].subject
        assert reverse("pool", kwargs={"tenant_slug": "acme", "pk": pool.pk}) in sent[person.email].body
        assert "uncorrected ECC errors (count 2)" in sent[person.email].body
    assert "Acme" in sent[approver.email].subject
    assert reverse("monitoring-faults") in sent[approver.email].body
    assert GpuFault.objects.get().notified_at is not None


def test_each_pool_on_the_gpu_is_told_to_its_own_people_and_opting_out_is_honoured(
    fleet,  # noqa: F811
    tenancy,
    approver,
):
    theirs = active_pool(tenancy.recsys, tenancy.globex_member, approver, [("h200-141gb.mig-1g.18gb", 2)])
    ours = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h200-141gb.mig-1g.18gb", 1)])
    gpu = gpu_of(ours)
    assert gpu_of(theirs) == gpu
    for person in (tenancy.acme_admin, approver):
        Preferences.objects.create(user=person, emails_off=[FAULT_EMAIL_TOPIC])
    push(fleet, report("h200-1", **{f"g{gpu.index}": {"ecc_uncorrected": 1}}))

    fault = GpuFault.objects.get()
    assert sorted(fault.notices.values_list("pool", flat=True)) == sorted([ours.pk, theirs.pk])
    assert tell().sent == 2
    sent = {message.to[0]: message for message in mail.outbox}
    assert set(sent) == {tenancy.acme_member.email, tenancy.globex_member.email}  # no approver, no admin
    assert f"#{ours.pk}" in sent[tenancy.acme_member.email].subject
    assert f"#{theirs.pk}" not in sent[tenancy.acme_member.email].body
    assert f"#{theirs.pk}" in sent[tenancy.globex_member.email].subject


def test_one_fatal_xid_under_a_live_pool_is_one_e_mail_to_each_person(
    fleet,  # noqa: F811
    tenancy,
    approver,
    staff_user,
    settings,
):
    settings.MONITORING_ALERT_WEBHOOK_URL = ""
    operator = staff_user("operator")
    both = UserFactory(username="opal", is_staff=True)  # an operator who approves too
    both.groups.add(*Group.objects.filter(name__in=[PlatformRole.OPERATOR, PlatformRole.APPROVER]))
    AlertRule.objects.filter(kind="xid").update(extra_emails="oncall@ops.example")
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    gpu = gpu_of(pool)
    xid(fleet, gpu)

    assert tell().sent == 6
    assert tell().sent == 0

    member, admin = tenancy.acme_member, tenancy.acme_admin
    everyone = [operator, both, approver, member, admin]
    assert addressed() == sorted([*(person.email for person in everyone), "oncall@ops.example"])
    sent = {message.to[0]: message for message in mail.outbox}
    alert = Alert.objects.get(rule__kind="xid")
    fired = f'The alert "XID error" (critical) fired on sim/h100-1 GPU {gpu.index}'
    pools = f"Pool #{pool.pk} of Acme / {pool.project.name} holds capacity on a faulty GPU"
    mine = f"A GPU holding instances of your pool #{pool.pk}"
    # The operator who approves reads in one e-mail what fired and which pools it affects.
    assert sent[both.email].subject == f"[GPU Portal] [critical] XID error on sim/h100-1 GPU {gpu.index}"
    assert fired in sent[both.email].body and pools in sent[both.email].body
    assert f"/monitoring/alerts/{alert.pk}/" in sent[both.email].body
    for address in (operator.email, "oncall@ops.example"):
        assert fired in sent[address].body and pools not in sent[address].body
    assert pools in sent[approver.email].body and fired not in sent[approver.email].body
    for person in (member, admin):
        assert mine in sent[person.email].body and "XID 79" in sent[person.email].body
        assert fired not in sent[person.email].body and pools not in sent[person.email].body
    # One row each, the combined one about the alert and the fault: the alert's page lists it.
    rows = {row.target: row for row in Delivery.objects.all()}
    assert len(rows) == 6
    assert (rows[both.email].alert, rows[both.email].fault) == (alert, GpuFault.objects.get())
    assert rows[both.email].as_approver and rows[both.email].fault_pools == [pool.pk]
    assert rows[member.email].alert is None and not rows[member.email].as_approver


def test_a_send_that_fails_is_retried_alone_and_the_person_still_gets_one_e_mail(
    fleet,  # noqa: F811
    tenancy,
    approver,
    settings,
    monkeypatch,
):
    settings.EMAIL_BACKEND = f"{__name__}.RefusesOnce"
    settings.MONITORING_ALERT_RETRY_SECONDS = 30
    monkeypatch.setattr(RefusesOnce, "refusing", {approver.email})
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    xid(fleet, gpu_of(pool))
    t = timezone.now()

    alerts.evaluate(now=t)
    done = sending.deliver_due(now=t)

    assert (done.sent, done.failed, done.gave_up) == (2, 1, 0)  # the tenant's people: theirs went out
    waiting = Delivery.objects.get(sent_at__isnull=True)
    assert (waiting.target, waiting.attempts) == (approver.email, 1)
    assert waiting.next_attempt_at == t + timedelta(seconds=30) and "try again later" in waiting.last_error
    assert sending.deliver_due(now=t + timedelta(seconds=29)).sent == 0
    assert sending.deliver_due(now=t + timedelta(seconds=30)).sent == 1
    assert sending.deliver_due(now=t + timedelta(hours=1)) == sending.Delivered()
    assert addressed() == sorted([tenancy.acme_member.email, tenancy.acme_admin.email, approver.email])


def test_without_a_rule_to_fire_the_fault_is_told_alone_and_operators_hear_nothing(
    fleet,  # noqa: F811
    tenancy,
    approver,
    staff_user,
):
    AlertRule.objects.filter(kind__in=["xid", "ecc"]).update(enabled=False)
    operator = staff_user("operator")
    pool = active_pool(tenancy.vision, tenancy.acme_member, approver, [("h100-80gb.full", 1)])
    xid(fleet, gpu_of(pool))

    evaluation = alerts.evaluate()
    assert (evaluation.fired, evaluation.faults, evaluation.notifications) == (0, 1, 3)
    assert sending.deliver_due().sent == 3
    assert operator.email not in addressed()
    assert alerts.evaluate().faults == 0  # told once
