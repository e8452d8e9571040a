"""The API tokens page is one tab of a person's account pages: reached from the top bar's account link,
and a token made there is shown once, works in the API, and stops when revoked there."""

from django.urls import reverse

from portal.models import ApiToken


def test_the_account_page_leads_to_the_tokens_and_they_work_end_to_end(tenancy, client_for, api_client):
    client = client_for(tenancy.acme_member)
    home = client.get(reverse("home")).content.decode()
    account = reverse("account_email")
    assert f'href="{account}"' in home  # the top bar's account link

    page = client.get(account)
    assert page.status_code == 200
    assert f'href="{reverse("api-tokens")}"' in page.content.decode()

    made = client.post(reverse("api-tokens"), {"name": "laptop"})
    key = made.context["issued"].key
    assert made.status_code == 200 and key in made.content.decode()
    assert key not in client.get(reverse("api-tokens")).content.decode()  # shown only that once
    api_client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert api_client.get(reverse("v1:tenant-list")).status_code == 200

    token = ApiToken.objects.get(user=tenancy.acme_member, name="laptop")
    assert client.post(reverse("api-token-revoke", kwargs={"pk": token.pk})).status_code == 302
    assert api_client.get(reverse("v1:tenant-list")).status_code == 401
