"""Pool requests through the API: submit, decide, cancel — and every refusal changes nothing."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pools.models import PoolEvent, PoolRequest, RequestState
from tests.factories import GpuGroupFactory, MembershipFactory, ProjectFactory

URL = "/api/v1/pool-requests/"


def body(tenancy, **overrides):
    return {
        "project": tenancy.vision.pk,
        "items": [{"spec": "h200-141gb.mig-1g.18gb", "count": 2}, {"spec": "h100-80gb.full", "count": 1}],
        "purpose": "inference",
        "justification": "serving a vision model",
        **overrides,
    }


def submit(client, tenancy, **overrides):
    return client.post(URL, body(tenancy, **overrides), format="json")


def test_a_member_submits_and_sees_the_request(fleet, tenancy, api_for):
    response = submit(api_for(tenancy.acme_member), tenancy)
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "submitted" and data["project"] == tenancy.vision.pk
    assert data["items"] == [
        {"spec": "h200-141gb.mig-1g.18gb", "gpu_model": "H200-141GB", "profile": "1g.18gb", "count": 2},
        {"spec": "h100-80gb.full", "gpu_model": "H100-80GB", "profile": "full", "count": 1},
    ]
    assert data["estimated_hourly_cost"] is None  # no price list yet
    assert data["submitted_by"] == "alice" and data["queue_position"] is None and data["pool"] is None
    events = PoolEvent.objects.filter(request_id=data["id"]).values_list("from_state", "to_state")
    assert list(events) == [("", "submitted")]


@pytest.mark.parametrize(
    ("overrides", "field_or_message"),
    [
        ({"items": [{"spec": "h200-141gb.mig-9g.99gb", "count": 1}]}, "is offered as h200-141gb.full,"),
        ({"items": [{"spec": "rtx-4090.full", "count": 1}]}, "Unknown spec"),
        ({"items": [{"spec": "h100-80gb.full", "count": 0}]}, "items"),
        ({"items": [{"spec": "h100-80gb.full", "count": -3}]}, "items"),
        ({"items": [{"spec": "h100-80gb.full", "count": 9}]}, "could ever hold (8)"),
        ({"items": [{"spec": "h200-141gb.mig-1g.18gb", "count": 113}]}, "could ever hold (112)"),
        ({"items": []}, "items"),
        ({"items": [{"spec": "h100-80gb.full", "count": 1}] * 2}, "listed twice"),
        ({"project": 999999}, "project"),
        ({"cluster": "nope"}, "cluster"),
        ({"justification": "x" * 4001}, "justification"),
        ({"purpose": "p" * 41}, "purpose"),
    ],
)
def test_bad_requests_are_refused_and_nothing_is_written(
    overrides, field_or_message, fleet, tenancy, api_for
):
    response = submit(api_for(tenancy.acme_member), tenancy, **overrides)
    assert response.status_code == 400, response.content
    assert field_or_message in response.content.decode()
    assert not PoolRequest.objects.exists()


def test_another_tenants_project_does_not_exist_for_you(fleet, tenancy, api_for):
    response = submit(api_for(tenancy.globex_member), tenancy)
    assert response.status_code == 400 and "project" in response.json()
    assert not PoolRequest.objects.exists()


def test_viewers_cannot_request(fleet, tenancy, api_for):
    response = submit(api_for(tenancy.acme_viewer), tenancy)
    assert response.status_code == 403 and "Viewers" in response.json()["detail"]
    assert not PoolRequest.objects.exists()


def test_purpose_must_name_a_group_where_the_cluster_has_groups(fleet, tenancy, api_for):
    training = GpuGroupFactory(cluster=fleet, name="training")
    fleet.nodes.update(group=training)
    client = api_for(tenancy.acme_member)
    response = submit(client, tenancy, cluster="sim", purpose="inference")
    assert response.status_code == 400 and "training" in response.json()["detail"]
    assert submit(client, tenancy, purpose="no-such-group").status_code == 400  # any cluster: the same
    assert submit(client, tenancy, cluster="sim", purpose="training").status_code == 201


def test_what_no_cluster_could_ever_give_in_the_group_is_refused_and_says_where_it_is(
    fleet, tenancy, api_for
):
    """The H100 node is in group inference, the H200 nodes in training: H100s for training can never
    be placed, however long they wait."""
    for name, prefix in (("training", "h200"), ("inference", "h100")):
        group = GpuGroupFactory(cluster=fleet, name=name)
        fleet.nodes.filter(name__startswith=prefix).update(group=group)
    client = api_for(tenancy.acme_member)
    items = [{"spec": "h100-80gb.full", "count": 1}]
    response = submit(client, tenancy, items=items, purpose="training")
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "1 × h100-80gb.full is more than any cluster in group training could ever hold (0); "
        "it is in: sim (8), sim/inference (8)."
    )
    assert not PoolRequest.objects.exists()
    assert submit(client, tenancy, items=items, purpose="inference").status_code == 201
    offers = {s["id"]: s for s in client.get("/api/v1/specs/?purpose=training").json()["results"]}
    assert "h100-80gb.full" not in offers and offers["h200-141gb.full"]["total"] == 16


def test_items_that_fit_alone_but_never_together_are_refused(fleet, tenancy, api_for):
    items = [{"spec": "h100-80gb.full", "count": 5}, {"spec": "h100-80gb.mig-7g.80gb", "count": 4}]
    response = submit(api_for(tenancy.acme_member), tenancy, items=items, purpose="")
    assert response.status_code == 400 and "not together" in response.json()["detail"]


def test_the_specs_api_filters_by_purpose_and_cluster(fleet, tenancy, api_for):
    client = api_for(tenancy.acme_member)
    assert client.get("/api/v1/specs/?cluster=nope").status_code == 400
    assert client.get("/api/v1/specs/?cluster=sim&purpose=p%00").status_code == 400
    GpuGroupFactory(cluster=fleet, name="training")
    unknown = client.get("/api/v1/specs/?purpose=inference")
    assert unknown.status_code == 400 and "training" in unknown.json()["detail"]
    assert client.get("/api/v1/specs/?cluster=sim&purpose=training").json()["count"] == 0  # no node in it


def test_malformed_json_is_a_400(fleet, tenancy, api_for):
    response = api_for(tenancy.acme_member).post(URL, "{oops", content_type="application/json")
    assert response.status_code == 400 and "JSON" in response.json()["detail"]


@pytest.fixture
def submitted(fleet, tenancy, api_for):
    return submit(api_for(tenancy.acme_member), tenancy).json()["id"]


def test_an_approver_approves_once(submitted, staff_user, api_for):
    client = api_for(staff_user("approver"))
    response = client.post(f"{URL}{submitted}/approve/", {"priority": 5}, format="json")
    assert response.status_code == 200
    assert (response.json()["state"], response.json()["priority"], response.json()["decided_by"]) == (
        "approved",
        5,
        "staff-approver",
    )
    again = client.post(f"{URL}{submitted}/approve/", {}, format="json")
    assert again.status_code == 409 and "approved" in again.json()["detail"]
    assert PoolEvent.objects.filter(request_id=submitted).count() == 2


@pytest.mark.parametrize("who", ["acme_admin", "acme_member"])
def test_tenants_cannot_decide(who, submitted, tenancy, api_for):
    response = api_for(getattr(tenancy, who)).post(f"{URL}{submitted}/approve/", {}, format="json")
    assert response.status_code == 403
    assert PoolRequest.objects.get(pk=submitted).state == RequestState.SUBMITTED


def test_a_rejection_needs_a_reason(submitted, staff_user, api_for):
    client = api_for(staff_user("approver"))
    assert client.post(f"{URL}{submitted}/reject/", {"reason": "  "}, format="json").status_code == 400
    assert client.post(f"{URL}{submitted}/reject/", {}, format="json").status_code == 400
    assert PoolRequest.objects.get(pk=submitted).state == RequestState.SUBMITTED
    response = client.post(f"{URL}{submitted}/reject/", {"reason": "no budget this quarter"}, format="json")
    assert response.json()["state"] == "rejected"
    assert response.json()["decision_reason"] == "no budget this quarter"


@pytest.mark.parametrize(("who", "status"), [("acme_member", 200), ("acme_admin", 200), ("acme_viewer", 403)])
def test_who_may_cancel(who, status, submitted, tenancy, api_for):
    response = api_for(getattr(tenancy, who)).post(f"{URL}{submitted}/cancel/", {}, format="json")
    assert response.status_code == status
    expected = RequestState.CANCELLED if status == 200 else RequestState.SUBMITTED
    assert PoolRequest.objects.get(pk=submitted).state == expected


def test_a_decided_request_cannot_be_cancelled_or_decided_again(submitted, tenancy, staff_user, api_for):
    api_for(staff_user("approver")).post(f"{URL}{submitted}/reject/", {"reason": "no"}, format="json")
    client = api_for(tenancy.acme_member)
    response = client.post(f"{URL}{submitted}/cancel/", {}, format="json")
    assert response.status_code == 409 and "rejected" in response.json()["detail"]


def test_foreign_requests_answer_404(submitted, tenancy, api_for):
    client = api_for(tenancy.globex_member)
    assert client.get(f"{URL}{submitted}/").status_code == 404
    assert client.post(f"{URL}{submitted}/cancel/", {}, format="json").status_code == 404
    assert client.get(URL).json()["results"] == []
    assert PoolRequest.objects.get(pk=submitted).state == RequestState.SUBMITTED


def test_queue_positions_follow_priority_then_approval_time(fleet, tenancy, staff_user, api_for):
    member, approver = api_for(tenancy.acme_member), staff_user("approver")
    ids = [submit(member, tenancy).json()["id"] for _ in range(3)]
    client = api_for(approver)
    client.post(f"{URL}{ids[0]}/approve/", {}, format="json")
    client.post(f"{URL}{ids[1]}/approve/", {}, format="json")
    client.post(f"{URL}{ids[2]}/approve/", {"priority": 10}, format="json")
    positions = {r["id"]: r["queue_position"] for r in client.get(URL).json()["results"]}
    assert positions == {ids[2]: 1, ids[0]: 2, ids[1]: 3}


def test_the_request_list_runs_a_constant_number_of_queries(fleet, tenancy, api_for):
    member = api_for(tenancy.acme_member)
    submit(member, tenancy)

    def queries():
        with CaptureQueriesContext(connection) as ctx:
            assert member.get(URL).status_code == 200
        return len(ctx)

    few = queries()
    for _ in range(10):
        submit(member, tenancy, project=ProjectFactory(tenant=tenancy.acme).pk)
    MembershipFactory(tenant=tenancy.acme)
    assert queries() == few


def test_approvers_approve_in_bulk_and_reject_with_a_reason_in_the_admin(
    fleet, tenancy, staff_user, api_for, client
):
    member = api_for(tenancy.acme_member)
    ids = [submit(member, tenancy).json()["id"] for _ in range(3)]
    client.force_login(staff_user("approver"))
    changelist = "/admin/pools/poolrequest/"
    assert client.get(changelist + "?state__exact=submitted").status_code == 200
    response = client.post(changelist, {"action": "approve", "_selected_action": ids[:2]})
    assert response.status_code == 302
    assert list(PoolRequest.objects.filter(pk__in=ids).order_by("pk").values_list("state", flat=True)) == [
        "approved",
        "approved",
        "submitted",
    ]
    ask = client.post(changelist, {"action": "reject", "_selected_action": [ids[2]]})
    assert ask.status_code == 200 and "their tenants read the reason" in ask.content.decode()
    client.post(changelist, {"action": "reject", "_selected_action": [ids[2]], "reason": "duplicate"})
    rejected = PoolRequest.objects.get(pk=ids[2])
    assert (rejected.state, rejected.decision_reason) == ("rejected", "duplicate")
    page = client.get(f"{changelist}{ids[2]}/change/").content.decode()
    assert "duplicate" in page and 'name="items-0-count"' not in page  # decided: items are read-only


def test_specs_list_what_can_be_requested_with_live_availability(fleet, tenancy, staff_user, api_for):
    from pools.services import admit_waiting

    client = api_for(tenancy.acme_member)
    specs = {s["id"]: s for s in client.get("/api/v1/specs/").json()["results"]}
    full = specs["h100-80gb.full"]
    assert full == {
        "id": "h100-80gb.full",
        "gpu_model": "H100-80GB",
        "profile": "full",
        "kind": "whole",
        "memory_gb": 80.0,
        "compute_slices": 7,
        "hourly_price": None,
        "currency": "KRW",
        "available": 8,
        "total": 8,
        "by_cluster": [{"cluster": "sim", "available": 8, "total": 8}],
    }
    assert specs["h200-141gb.mig-1g.18gb"]["available"] == 16 * 7  # every H200 holds nothing yet
    assert specs["h200-141gb.mig-3g.71gb"]["compute_slices"] == 3
    assert "a100-80gb.full" not in specs  # no such GPU in the fleet
    request = submit(client, tenancy, items=[{"spec": "h100-80gb.full", "count": 3}]).json()["id"]
    api_for(staff_user("approver")).post(f"{URL}{request}/approve/", {}, format="json")
    admit_waiting()
    assert {s["id"]: s for s in client.get("/api/v1/specs/").json()["results"]}["h100-80gb.full"][
        "available"
    ] == 5


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (0, "must be a whole number above zero"),
        (True, "must be a whole number above zero"),
        (10_001, "at most 10,000 of h100-80gb.full"),
    ],
)
def test_the_service_says_what_is_wrong_with_a_count(count, message, fleet, tenancy):
    from pools.services import submit_request
    from portal.errors import InvalidInput

    with pytest.raises(InvalidInput, match=message):
        submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", count)])
    assert not PoolRequest.objects.exists()
