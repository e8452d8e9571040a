"""The quotas' API: rows a tenant's people see of their own tenant and staff of all, set by operators and
approvers only, bad input answered 400 with nothing written; the tenants' admission policy through the
tenants' API; a request's quota verdict and a pool's borrowed flag."""

import pytest

from pools.models import Pool, Quota, TenantPolicy
from pools.services import admit_waiting, approve_request, submit_request
from pools.services.quotas import set_quota

H100 = "H100-80GB"


def rows(answer) -> list[dict]:
    assert answer.status_code == 200, answer.content
    return answer.json()["results"]


def test_each_sees_the_quotas_of_their_own_tenant_and_staff_see_all(fleet, tenancy, operator, api_for):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=28)
    set_quota(actor=operator, tenant=tenancy.globex, gpu_model=H100, guaranteed=7)
    mine = rows(api_for(tenancy.acme_viewer).get("/api/v1/quotas/"))
    assert mine == [
        {
            "tenant": "acme",
            "project": None,
            "group": "",
            "gpu_model": H100,
            "guaranteed": 14,
            "limit": 28,
            "held": 0,
            "borrowed": 0,
        }
    ]
    assert rows(api_for(tenancy.outsider).get("/api/v1/quotas/")) == []
    assert [r["tenant"] for r in rows(api_for(operator).get("/api/v1/quotas/"))] == ["acme", "globex"]


def test_operators_and_approvers_set_a_row_and_nobody_else(fleet, tenancy, operator, approver, api_for):
    body = {"tenant": "acme", "group": "", "gpu_model": H100, "guaranteed": 14}
    for person in (tenancy.acme_admin, tenancy.acme_member):
        assert api_for(person).post("/api/v1/quotas/", body, format="json").status_code == 403
    assert not Quota.objects.exists()
    made = api_for(operator).post("/api/v1/quotas/", body, format="json")
    assert made.status_code == 201, made.content
    assert (made.json()["guaranteed"], made.json()["limit"]) == (14, 14)
    again = api_for(approver).post("/api/v1/quotas/", {**body, "limit": None}, format="json")
    assert again.status_code == 201 and again.json()["limit"] is None
    project = api_for(approver).post(
        "/api/v1/quotas/", {**body, "guaranteed": 0, "limit": 7, "project": "vision"}, format="json"
    )
    assert project.status_code == 201 and (project.json()["project"], project.json()["limit"]) == (
        "vision",
        7,
    )
    assert Quota.objects.count() == 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"guaranteed": "many"}, "valid integer"),
        ({"guaranteed": -7}, "greater than or equal to 0"),
        ({"guaranteed": 14, "limit": 7}, "below the guarantee"),
        ({"guaranteed": 70}, "in service"),
        ({"tenant": "nobody"}, "No tenant is named nobody"),
        ({"project": "nowhere"}, "has no project nowhere"),
        ({"gpu_model": "B200-180GB"}, "No GPU of the fleet is a B200-180GB"),
        ({"group": "inference"}, "No cluster has a GPU group inference"),
    ],
)
def test_bad_quotas_are_answered_400_and_write_nothing(fleet, tenancy, operator, api_for, change, words):
    body = {"tenant": "acme", "group": "", "gpu_model": H100, "guaranteed": 7, **change}
    answer = api_for(operator).post("/api/v1/quotas/", body, format="json")
    assert answer.status_code == 400 and words in answer.content.decode(), answer.content
    assert not Quota.objects.exists()


def test_approval_within_the_guarantee_is_a_tenant_setting_staff_change(fleet, tenancy, approver, api_for):
    url = "/api/v1/tenants/acme/"
    assert api_for(tenancy.acme_admin).get(url).json()["auto_approve_within_guarantee"] is False
    assert (
        api_for(tenancy.acme_admin)
        .patch(url, {"auto_approve_within_guarantee": True}, format="json")
        .status_code
        == 403
    )
    assert (
        api_for(tenancy.outsider)
        .patch(url, {"auto_approve_within_guarantee": True}, format="json")
        .status_code
        == 404
    )
    for bad in ({"auto_approve_within_guarantee": "perhaps"}, {"colour": "red"}):
        answer = api_for(approver).patch(url, bad, format="json")
        assert answer.status_code == 400, answer.content
    assert not TenantPolicy.objects.exists()
    answer = api_for(approver).patch(url, {"auto_approve_within_guarantee": True}, format="json")
    assert answer.status_code == 200 and answer.json()["auto_approve_within_guarantee"] is True
    assert TenantPolicy.objects.get(tenant=tenancy.acme).auto_approve_within_guarantee


def test_a_request_says_its_verdict_and_a_pool_whether_it_is_borrowed(
    fleet, tenancy, operator, approver, api_for
):
    set_quota(actor=operator, tenant=tenancy.acme, gpu_model=H100, guaranteed=14, limit=56)
    client = api_for(tenancy.acme_member)
    made = [
        client.post(
            "/api/v1/pool-requests/",
            {"project": tenancy.vision.pk, "items": [{"spec": "h100-80gb.full", "count": 2}]},
            format="json",
        ).json()
        for _ in range(2)
    ]
    assert [r["quota_verdict"] for r in made] == ["within", "within"]  # neither approved yet: each alone fits
    for request in made:
        approve_request(request_id=request["id"], approver=approver)
    admit_waiting()
    pools = {p["request"]: p for p in rows(client.get("/api/v1/pools/"))}
    assert [pools[r["id"]]["borrowed"] for r in made] == [False, True]
    assert all(p["reclaim_at"] is None for p in pools.values())
    verdicts = {r["id"]: r["quota_verdict"] for r in rows(client.get("/api/v1/pool-requests/"))}
    assert [verdicts[r["id"]] for r in made] == ["within", "borrowed"]  # judged again as admitted
    alone = client.get(f"/api/v1/pools/{Pool.objects.get(request_id=made[1]['id']).pk}/").json()
    assert alone["borrowed"] is True


def test_without_quotas_a_request_has_no_verdict(fleet, tenancy, api_for):
    request = submit_request(project=tenancy.vision, user=tenancy.acme_member, items=[("h100-80gb.full", 1)])
    answer = api_for(tenancy.acme_member).get(f"/api/v1/pool-requests/{request.pk}/").json()
    assert answer["quota_verdict"] is None
