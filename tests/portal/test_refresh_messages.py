"""A page's background refresh (portal.js sends X-Portal-Refresh) leaves a message meant for the next page
a person opens unread."""

from django.urls import reverse


def test_a_refresh_does_not_use_up_a_message(client, tenancy):
    client.force_login(tenancy.acme_admin)
    created = client.post(
        reverse("project-create", kwargs={"slug": "acme"}),
        {"name": "Speech", "slug": "speech", "namespace": "acme-speech"},
    )
    assert created.status_code == 302
    tenant_page = reverse("tenant", kwargs={"slug": "acme"})
    refreshed = client.get(tenant_page, HTTP_X_PORTAL_REFRESH="1").content.decode()
    assert "Project Speech created." not in refreshed
    assert "Project Speech created." in client.get(tenant_page).content.decode()
    assert "Project Speech created." not in client.get(tenant_page).content.decode()  # shown once
