"""One truth about availability: what the specs API offers within a purpose's group is what the queue
admits at once, on random fleets with groups; what no cluster could ever give there is refused."""

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pools.models import Pool, RequestState
from pools.services import admit_waiting, approve_request, submit_request
from pools.services.inventory import sync_inventory
from portal.errors import InvalidInput
from tests.examples import examples
from tests.factories import ClusterFactory, GpuGroupFactory

LAYOUTS = {  # per model: MIG off, or a layout partly or wholly cut
    "H100-80GB": [None, {"1g.10gb": 7}, {"3g.40gb": 2}, {"4g.40gb": 1}],
    "H200-141GB": [None, {"1g.18gb": 7}, {"3g.71gb": 2}, {"4g.71gb": 1, "3g.71gb": 1}],
}
GROUPS = ["training", "inference"]


@st.composite
def fleets(draw):
    """One or two clusters of one to three nodes, each node of one model and in a group or none."""
    clusters = []
    for c in range(draw(st.integers(1, 2))):
        nodes = []
        for n in range(draw(st.integers(1, 3))):
            model = draw(st.sampled_from(sorted(LAYOUTS)))
            layouts = [draw(st.sampled_from(LAYOUTS[model])) for _ in range(draw(st.integers(1, 3)))]
            nodes.append((f"c{c}n{n}", model, layouts, draw(st.sampled_from([None, *GROUPS]))))
        clusters.append((f"cluster-{c}", nodes))
    return clusters


def build(clusters):
    for name, nodes in clusters:
        cluster = ClusterFactory(
            name=name, fleet=[(prefix, 1, model, layouts) for prefix, model, layouts, _g in nodes]
        )
        sync_inventory(cluster=cluster)
        for prefix, _model, _layouts, group in nodes:
            if group:
                gpu_group = GpuGroupFactory(cluster=cluster, name=group)
                cluster.nodes.filter(name__startswith=prefix).update(group=gpu_group)


@pytest.mark.django_db
@settings(
    max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(clusters=fleets(), purpose=st.sampled_from(["", *GROUPS]), pick=st.integers(0, 200))
def test_what_the_specs_api_offers_in_a_group_is_admitted_at_once(
    clusters, purpose, pick, tenancy, api_for, staff_user, settings
):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0
    approver = staff_user("approver")
    client = api_for(tenancy.acme_member)
    with transaction.atomic():
        build(clusters)
        response = client.get(f"/api/v1/specs/?purpose={purpose}&limit=500")
        if response.status_code == 400:  # a purpose no cluster's groups name: refused, as at submit
            with pytest.raises(InvalidInput):
                submit_request(
                    project=tenancy.vision,
                    user=tenancy.acme_member,
                    items=[("h100-80gb.full", 1)],
                    purpose=purpose,
                )
            transaction.set_rollback(True)
            return
        offers = response.json()["results"]
        offered = [o for o in offers if o["available"] > 0]
        if offered:
            offer = offered[pick % len(offered)]
            request = submit_request(
                project=tenancy.vision,
                user=tenancy.acme_member,
                items=[(offer["id"], offer["available"])],
                purpose=purpose,
            )
            approve_request(request_id=request.pk, approver=approver)
            admit_waiting()
            request.refresh_from_db()
            assert request.state == RequestState.FULFILLED, (offer, request.waiting_reason)
            assert Pool.objects.filter(request=request).exists()
        ids = {o["id"] for o in offers}
        for spec in ("h100-80gb.full", "h200-141gb.full"):
            if spec not in ids:  # nothing of it in the purpose's group, anywhere: refused at submit
                with pytest.raises(InvalidInput):
                    submit_request(
                        project=tenancy.vision, user=tenancy.acme_member, items=[(spec, 1)], purpose=purpose
                    )
        transaction.set_rollback(True)
