"""`manage.py demo`: the people the README lists, created once however often it runs."""

from django.contrib.auth import get_user_model
from django.core.management import call_command

from portal.models import Membership, Project, Tenant


def counts():
    return (
        Tenant.objects.count(),
        Project.objects.count(),
        get_user_model().objects.count(),
        Membership.objects.count(),
    )


def test_demo_is_idempotent_keeps_tenants_apart_and_leaves_work_for_each_workspace(db, client):
    from pools.models import Pool, PoolRequest

    call_command("demo", verbosity=0)
    first = counts()
    call_command("demo", verbosity=0)
    assert counts() == first

    for user, own, foreign in [("alice", "acme", "globex"), ("mallory", "globex", "acme")]:
        assert client.login(username=user, password="demo-password")
        body = client.get("/").content.decode()
        assert f"{own}-" in body and f"{foreign}-" not in body
        client.logout()

    bob = Membership.objects.get(user__username="bob")
    assert bob.role == "admin" and bob.tenant.slug == "acme"
    staff = {
        u.username: {g.name for g in u.groups.all()} for u in get_user_model().objects.filter(is_staff=True)
    }
    assert staff == {"carol": {"approver"}, "dave": {"finance"}, "erin": {"operator"}, "admin": set()}
    assert get_user_model().objects.get(username="admin").is_superuser

    assert PoolRequest.objects.filter(state="submitted").count() == 1  # for carol to decide
    # admitted now (the worker provisions them); the billing history's pools were all released
    assert Pool.objects.filter(released_at=None).count() == 3
    shares = Pool.objects.filter(released_at=None, allocations__profile="ts-4").distinct().get()
    assert sorted(shares.allocations.values_list("profile", flat=True)) == ["ts-4", "ts-4"]
    assert shares.cluster.name == "seoul-a" and shares.allocations.first().gpu.node.name == "l40s-serve-1"
    assert set(Pool.objects.values_list("project__tenant__slug", flat=True)) == {"acme", "globex"}
