"""The portal's icon: linked from every page, and /favicon.ico (asked for by browsers anyway) leads to it."""

import re

import pytest
from django.urls import reverse

pytestmark = pytest.mark.django_db


def test_favicon_ico_leads_to_the_icon_for_anyone(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301
    icon = client.get(response.url)
    assert icon.status_code == 200
    assert icon["Content-Type"] == "image/svg+xml"
    assert b"<svg" in b"".join(icon.streaming_content)


@pytest.mark.parametrize("url", [reverse("account_login"), "/no/such/page/"])
def test_pages_link_the_icon(client, url):
    page = client.get(url).content.decode()
    link = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', page)
    assert link, page[:800]
    assert client.get(link[1]).status_code == 200
    assert link[1] == client.get("/favicon.ico").url
