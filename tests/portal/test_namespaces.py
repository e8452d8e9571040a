"""Project namespaces: always `<tenant>-<suffix>`, never the cluster's, the add-ons' or the portal's,
and never reaching into another tenant's names."""

import pytest
from django.urls import reverse

from portal.models import Project, Tenant
from tests.factories import ProjectFactory, TenantFactory, UserFactory

RESERVED = [
    "default",
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "gpu-operator",
    "monitoring",
    "cert-manager",
    "ingress-nginx",
    "openshift-monitoring",
    "gpu-portal",  # the portal's own (PORTAL_NAMESPACE)
]


def create(client, tenant, namespace, slug="new"):
    return client.post(
        "/api/v1/projects/",
        {"tenant": tenant, "slug": slug, "name": "N", "namespace": namespace},
        format="json",
    )


@pytest.mark.parametrize("namespace", RESERVED)
def test_every_reserved_namespace_is_refused(namespace, tenancy, api_for):
    """Asked for as is, or by a tenant whose short name would make it its own."""
    client = api_for(tenancy.acme_admin)
    response = create(client, "acme", namespace)
    assert response.status_code == 400
    if "-" in namespace:
        tenant_slug = namespace.partition("-")[0]
        owner = TenantFactory(slug=tenant_slug)
        owner.memberships.create(user=tenancy.acme_admin, role="admin")
        response = create(client, tenant_slug, namespace)
        assert response.status_code == 400, response.json()
        assert "reserved" in response.json()["detail"]
    assert not Project.objects.filter(namespace=namespace).exists()


def test_a_tenant_cannot_take_another_tenants_namespace(tenancy, api_for):
    taken = create(api_for(tenancy.acme_admin), "acme", "globex-future")
    assert taken.status_code == 400
    assert "must start with acme-" in taken.json()["detail"]
    future = create(api_for(tenancy.globex_member), "globex", "", slug="future")
    assert future.status_code == 403  # a member, not an admin: refused for the role, not the name
    admin = UserFactory(username="gadmin")
    tenancy.globex.memberships.create(user=admin, role="admin")
    assert create(api_for(admin), "globex", "", slug="future").json()["namespace"] == "globex-future"


def test_a_longer_tenant_name_owns_its_prefix(tenancy, api_for):
    labs = TenantFactory(slug="acme-labs")
    response = create(api_for(tenancy.acme_admin), "acme", "acme-labs-gpu")
    assert response.status_code == 400
    assert "reserved for another tenant" in response.json()["detail"]
    assert create(api_for(tenancy.acme_admin), "acme", "acme-lab-gpu").status_code == 201
    ProjectFactory(tenant=labs, slug="gpu")
    assert Project.objects.get(tenant=labs).namespace == "acme-labs-gpu"


@pytest.mark.parametrize(
    ("slug", "message"),
    [
        ("kube", "reserved"),
        ("ingress", "reserved"),
        ("openshift", "reserved"),
        ("nvidia", "reserved"),
        ("acme-vision", "Existing namespaces start with acme-vision-"),
    ],
)
def test_a_tenant_short_name_must_leave_room_for_namespaces(slug, message, tenancy, client_for):
    ProjectFactory(tenant=tenancy.acme, slug="vision-two")  # namespace acme-vision-two
    admin = client_for(UserFactory(username="root", is_staff=True, is_superuser=True))
    response = admin.post(reverse("admin:portal_tenant_add"), _tenant_form(slug))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Tenant.objects.filter(slug=slug).exists()


def _tenant_form(slug):
    return {
        "name": slug.title(),
        "slug": slug,
        "projects-TOTAL_FORMS": 0,
        "projects-INITIAL_FORMS": 0,
        "memberships-TOTAL_FORMS": 0,
        "memberships-INITIAL_FORMS": 0,
    }


def test_the_admin_checks_a_new_projects_namespace_and_freezes_it(tenancy, client_for):
    admin = client_for(UserFactory(username="root", is_staff=True, is_superuser=True))
    form = {"tenant": tenancy.acme.pk, "slug": "ops", "name": "Ops", "namespace": "monitoring"}
    refused = admin.post(reverse("admin:portal_project_add"), form)
    assert refused.status_code == 200 and "must start with acme-" in refused.content.decode()
    assert (
        admin.post(reverse("admin:portal_project_add"), {**form, "namespace": "acme-ops"}).status_code == 302
    )

    project = Project.objects.get(namespace="acme-ops")
    change = reverse("admin:portal_project_change", args=[project.pk])
    admin.post(
        change, {"slug": "ops", "name": "Ops", "namespace": "kube-system", "tenant": tenancy.globex.pk}
    )
    project.refresh_from_db()
    assert (project.namespace, project.tenant) == ("acme-ops", tenancy.acme)

    tenant_change = reverse("admin:portal_tenant_change", args=[tenancy.acme.pk])
    assert 'name="slug"' not in admin.get(tenant_change).content.decode()  # the short name is fixed


def test_the_tenant_page_form_says_why(tenancy, client_for):
    client = client_for(tenancy.acme_admin)
    response = client.post(
        reverse("project-create", kwargs={"slug": "acme"}),
        {"name": "Mon", "slug": "mon", "namespace": "cert-manager"},
    )
    assert response.status_code == 400
    assert "must start with acme-" in response.content.decode()
