"""Korean pages say their states, reasons and words in Korean: no English enum label shows through.

The words come from the models' choices (request and pool states, health, alert states and severities,
MIG manager states, the "full" profile word), so a new state is checked without touching this test.
"""

import re
from html.parser import HTMLParser

import pytest
from django.urls import reverse
from django.utils import translation

from monitoring.models import Alert
from monitoring.models.alerts import Severity
from pools.mig import FULL_GPU, MigState
from pools.models import Health, Pool, PoolRequest, PoolState, RequestState
from pools.placement.reasons import Reason
from pools.selectors import event_reason, render_reason, waiting_reason
from pools.services import (
    admit_waiting,
    approve_request,
    cancel_request,
    fail_pool,
    finish_release,
    provision_step,
    reject_request,
    release_pool,
    set_priority,
    submit_request,
)
from pools.services.inventory import sync_inventory
from tests.factories import AlertFactory, ClusterFactory, PoolFactory
from tests.pools.test_placement import H100, ask, gpu, placed
from tests.pools.test_placement import fleet as gpus

pytestmark = pytest.mark.django_db

FLEET = [("h100", 1, "H100-80GB", [None] * 2), ("h200", 1, "H200-141GB", [{"3g.71gb": 2}, None])]


def english_words() -> set[str]:
    with translation.override("en"):
        labels = [
            str(label)
            for choices in (RequestState, PoolState, Health, Alert.State, Severity)
            for label in choices.labels
        ]
    return {*labels, *(state.value for state in MigState), FULL_GPU}


class VisibleText(HTMLParser):
    """The text a reader sees: no tags, attributes, scripts, styles or code blocks."""

    HIDDEN = {"script", "style", "code", "pre", "head", "template"}

    def __init__(self):
        super().__init__()
        self.hidden, self.parts = 0, []

    def handle_starttag(self, tag, attrs):
        self.hidden += tag in self.HIDDEN

    def handle_endtag(self, tag):
        self.hidden -= tag in self.HIDDEN and self.hidden > 0

    def handle_data(self, data):
        if not self.hidden:
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = VisibleText()
    parser.feed(html)
    return " ".join(parser.parts)


def english_in(html: str, extra: tuple[str, ...] = ()) -> list[str]:
    """English words of the list found whole: not inside identifiers such as nvidia.com/mig-3g.71gb,
    h100-80gb.full or a CSS-like state-active."""
    text = " ".join(visible_text(html).split())
    found = []
    for word in sorted(english_words()):
        match = re.search(rf"(?<![\w./:-]){re.escape(word)}(?![\w./:-])", text, re.IGNORECASE)
        if match:
            found.append(f"{word}: …{text[max(0, match.start() - 40) : match.end() + 40]}…")
    return found + [sentence for sentence in extra if sentence in text]


@pytest.fixture
def fleet(settings):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0
    cluster = ClusterFactory(name="sim", fleet=FLEET)
    sync_inventory(cluster=cluster)
    return cluster


@pytest.fixture
def story(fleet, tenancy, staff_user):
    """A project's requests in every state, its pools in every state, each made through the services."""
    member, project, approver = tenancy.acme_member, tenancy.vision, staff_user("approver")

    def ask(items):
        return submit_request(project=project, user=member, items=items, justification="training")

    def provision(pool):
        while provision_step(pool_id=pool.pk) not in ("done", "failed"):
            pass

    fulfilled = ask([("h100-80gb.full", 2)])
    approve_request(request_id=fulfilled.pk, approver=approver)
    released = ask([("h200-141gb.mig-3g.71gb", 1)])
    approve_request(request_id=released.pk, approver=approver)
    admit_waiting()
    for pool in Pool.objects.all():
        provision(pool)
    release_pool(pool_id=Pool.objects.get(request=released).pk, user=member)
    finish_release(pool_id=Pool.objects.get(request=released).pk)
    queued = ask([("h100-80gb.full", 1)])
    approve_request(request_id=queued.pk, approver=approver)
    admit_waiting()
    queued.refresh_from_db()
    failed = PoolFactory(project=project, state=PoolState.PROVISIONING)
    fail_pool(pool_id=failed.pk, reason="the node refused the layout")
    rejected = ask([("h100-80gb.full", 1)])
    reject_request(request_id=rejected.pk, approver=approver, reason="no budget")
    cancelled = ask([("h100-80gb.full", 1)])
    cancel_request(request_id=cancelled.pk, user=member)
    submitted = ask([("h100-80gb.full", 1)])
    approved = ask([("h100-80gb.full", 1)])
    approve_request(request_id=approved.pk, approver=approver)
    PoolFactory(project=project, state=PoolState.PROVISIONING)
    AlertFactory(gpu=fleet.nodes.first().gpus.first(), severity=Severity.CRITICAL)
    return {
        "requests": [fulfilled, released, queued, rejected, cancelled, submitted, approved],
        "queued": queued,
        "approver": approver,
    }


def korean(client, url):
    response = client.get(url, HTTP_ACCEPT_LANGUAGE="ko")
    assert response.status_code == 200, url
    assert 'lang="ko"' in response.content.decode()[:500], url
    return response.content.decode()


def test_the_story_has_every_state(story):
    assert {r.state for r in PoolRequest.objects.all()} == set(RequestState.values) - set()
    assert {p.state for p in Pool.objects.all()} >= {PoolState.ACTIVE, PoolState.RELEASED, PoolState.FAILED}
    assert story["queued"].state == RequestState.QUEUED and story["queued"].waiting_reason


def test_a_member_reads_every_page_in_korean(story, tenancy, client):
    client.force_login(tenancy.acme_member)
    with translation.override("en"):
        reason = waiting_reason(story["queued"])
    urls = [
        reverse("home"),
        reverse("tenant", kwargs={"slug": "acme"}),
        reverse("project", kwargs={"tenant_slug": "acme", "slug": "vision"}),
        reverse("pool-request-new", kwargs={"tenant_slug": "acme", "slug": "vision"}),
        reverse("tenant-requests", kwargs={"tenant_slug": "acme"}),
        reverse("tenant-pools", kwargs={"tenant_slug": "acme"}),
        *(reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": r.pk}) for r in story["requests"]),
        *(reverse("pool", kwargs={"tenant_slug": "acme", "pk": p.pk}) for p in Pool.objects.all()),
    ]
    found = {url: english_in(korean(client, url), (reason,)) for url in urls}
    english = {url: words for url, words in found.items() if words}
    assert english == {}, "\n".join(f"{url}: {words}" for url, words in english.items())


def test_an_approver_reads_the_requests_in_korean(story, client):
    client.force_login(story["approver"])
    with translation.override("en"):
        reason = waiting_reason(story["queued"])
    urls = [
        reverse("admin:pools_poolrequest_changelist"),
        reverse("approvals"),
        reverse("approvals") + "?tab=queue",
        *(reverse("approval", kwargs={"pk": r.pk}) for r in story["requests"]),
    ]
    found = {url: english_in(korean(client, url), (reason,)) for url in urls}
    assert {url: words for url, words in found.items() if words} == {}


OPERATOR_PAGES = ["/capacity/", "capacity-group", "capacity-node", "/monitoring/", "/monitoring/alerts/"]


@pytest.mark.parametrize("url", [*OPERATOR_PAGES, "monitoring-pool"])
def test_an_operator_reads_the_fleet_in_korean(story, staff_user, client, url):
    client.force_login(staff_user("operator"))
    node = story["requests"][0].pool.allocations.first().gpu.node  # a node with a pool on it
    if url == "monitoring-pool":  # the active pool of whole GPUs
        url = reverse(url, kwargs={"pk": Pool.objects.get(state=PoolState.ACTIVE).pk})
    elif url == "capacity-group":
        url = reverse(url, kwargs={"pk": node.cluster_id, "group": node.group_id or "none"})
    elif url == "capacity-node":
        url = reverse(url, kwargs={"pk": node.pk})
    assert english_in(korean(client, url)) == []


def test_the_check_finds_english_words():
    page = '<p class="state-active">queued <code>failed</code> nvidia.com/gpu h100-80gb.full</p>'
    assert english_in(page) == ["queued: …queued nvidia.com/gpu h100-80gb.full…"]
    page = "<td>대기 중: needs 1 × full H100-80GB</td>"
    assert english_in(page, ("needs 1 × full",)) == [
        "full: …대기 중: needs 1 × full H100-80GB…",
        "needs 1 × full",
    ]


@pytest.mark.parametrize(
    ("fleet_", "request_"),
    [
        ([gpu("n1/0", off=True, busy=True)], ask((1, FULL_GPU))),
        ([gpu("n1/0", off=True), gpu("n1/1", "3g.40gb@0* 1g.10gb@4")], ask((2, "1g.10gb"), (1, FULL_GPU))),
        ([gpu("n1/0", schedulable=False)], ask((1, "1g.10gb"))),
        ([gpu("n1/0", "1g.10gb@0*")], ask((7, "1g.10gb"))),
        ([gpu("n1/0", off=True, model="A100-40GB")], ask((1, FULL_GPU, H100))),
    ],
)
def test_waiting_reasons_read_in_korean(fleet_, request_):
    reason = placed(gpus(*fleet_), request_).reason
    assert isinstance(reason, Reason)
    with translation.override("ko"):
        shown = render_reason(reason.as_data())
    assert not re.search(r"(?<![\w./-])(?:full|and|needs|free|together|GPUs)(?![\w./-])", shown), shown
    assert re.search("[가-힣]", shown), shown


def test_a_queue_event_and_a_priority_change_read_in_korean_after_the_reason_moves_on(story, tenancy, client):
    queued = story["queued"]
    set_priority(request_id=queued.pk, approver=story["approver"], priority=5)
    with translation.override("en"):
        queued_at_first = event_reason(queued.events.filter(to_state=RequestState.QUEUED).first(), queued)
    # The queue finds another reason later: the old event keeps its own, in each reader's language.
    PoolRequest.objects.filter(pk=queued.pk).update(waiting_reason="something else", waiting_reason_data=None)
    client.force_login(tenancy.acme_member)
    page = korean(client, reverse("pool-request", kwargs={"tenant_slug": "acme", "pk": queued.pk}))
    assert english_in(page, (queued_at_first, "priority set to")) == []
