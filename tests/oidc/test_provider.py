"""The test identity provider alone (tests/oidc/provider.mjs), over HTTP with no portal: what the portal's
single sign-on tests take from it — a real authorization-code flow, ID tokens signed by its published key
with the account's claims as they are now, the defects `tamper` promises, its login form and its sign-out."""

import base64
import hashlib
import secrets
from dataclasses import dataclass
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import jwt
import pytest
import requests
from django.http import HttpResponse, HttpResponseRedirect

from tests.oidc.plugin import CALLBACK, POST_LOGOUT, START, Page, sign_in, sign_out_at_provider

SCOPE = "openid profile email groups"


@dataclass
class Authorized:
    code: str
    state: str
    asked_for_password: bool


def authorize(
    idp, *, login="alice", password="secret", nonce="", redirect_uri=CALLBACK, **extra
) -> Authorized:
    """The authorization endpoint walked by hand, the login form posted when the provider shows it."""
    state = secrets.token_urlsafe(8)
    nonce = nonce or secrets.token_urlsafe(8)
    params = {"client_id": idp.client_id, "response_type": "code", "scope": SCOPE,
              "redirect_uri": redirect_uri, "state": state, "nonce": nonce, **extra}  # fmt: skip
    answer = idp.session.get(idp.authorization_endpoint, params=params, allow_redirects=False)
    asked = False
    for _ in range(10):
        if answer.is_redirect:
            location = urljoin(answer.url, answer.headers["Location"])
            if location.startswith(redirect_uri):
                query = parse_qs(urlsplit(location).query)
                assert query["state"] == [state]
                return Authorized(query["code"][0], state, asked)
            answer = idp.session.get(location, allow_redirects=False)
            continue
        form = Page(answer.text).form_with("password")
        assert answer.status_code == 200 and form is not None and not asked, answer.text
        answer = idp.session.post(
            urljoin(answer.url, form.action),
            data={"login": login, "password": password},
            allow_redirects=False,
        )
        asked = True
    raise AssertionError("no code after 10 steps")


def token_response(idp, code: str, *, basic: bool = False, redirect_uri=CALLBACK, **extra) -> dict:
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri, **extra}
    if basic:
        auth = (idp.client_id, idp.client_secret)
    else:
        auth, data = None, {**data, "client_id": idp.client_id, "client_secret": idp.client_secret}
    answer = requests.post(idp.token_endpoint, data=data, auth=auth, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def id_token_of(idp, *, nonce: str, login="alice") -> str:
    return token_response(idp, authorize(idp, login=login, nonce=nonce).code)["id_token"]


def verified(idp, id_token: str) -> dict:
    """The ID token's claims, its signature checked against the provider's published keys, and its issuer,
    audience and expiry as a relying party checks them."""
    keys = jwt.PyJWKSet.from_dict(requests.get(idp.jwks_uri, timeout=10).json())
    key = keys[jwt.get_unverified_header(id_token)["kid"]]
    return jwt.decode(id_token, key, algorithms=["RS256"], audience=idp.client_id, issuer=idp.issuer)


def test_discovery_names_the_issuer_its_endpoints_and_what_it_signs_in_with(idp):
    discovery = requests.get(f"{idp.issuer}/.well-known/openid-configuration", timeout=10).json()
    assert discovery["issuer"] == idp.issuer
    for endpoint in ("authorization_endpoint", "token_endpoint", "jwks_uri", "end_session_endpoint"):
        assert discovery[endpoint].startswith(f"{idp.issuer}/")
    assert {"openid", "profile", "email", "groups"} <= set(discovery["scopes_supported"])
    assert {"email", "email_verified", "groups", "amr", "preferred_username"} <= set(
        discovery["claims_supported"]
    )
    assert {"client_secret_post", "client_secret_basic"} <= set(
        discovery["token_endpoint_auth_methods_supported"]
    )


def test_a_code_flow_gives_an_id_token_signed_with_the_published_key_carrying_the_accounts_claims(idp):
    idp.set_account(
        "alice", email="alice@acme.test", email_verified=True, name="Alice Liddell", given_name="Alice",
        family_name="Liddell", preferred_username="alice", groups=["acme-admins"], amr=["pwd", "mfa"],
        acr="urn:portal:mfa",
    )  # fmt: skip
    authorized = authorize(idp, nonce="nonce-1")
    tokens = token_response(idp, authorized.code)

    claims = verified(idp, tokens["id_token"])
    assert authorized.asked_for_password
    assert claims["sub"] == "alice"
    assert claims["nonce"] == "nonce-1"
    assert (claims["email"], claims["email_verified"]) == ("alice@acme.test", True)
    assert (claims["name"], claims["given_name"], claims["family_name"]) == (
        "Alice Liddell",
        "Alice",
        "Liddell",
    )
    assert claims["preferred_username"] == "alice"
    assert claims["groups"] == ["acme-admins"]
    assert (claims["amr"], claims["acr"]) == (["pwd", "mfa"], "urn:portal:mfa")
    userinfo = requests.get(
        idp.discovery["userinfo_endpoint"],
        headers={"Authorization": f"Bearer {tokens['access_token']}"},
        timeout=10,
    ).json()
    assert (userinfo["sub"], userinfo["email"], userinfo["groups"]) == (
        "alice",
        "alice@acme.test",
        ["acme-admins"],
    )


def test_groups_go_as_the_account_has_them_whatever_their_type_and_acr_only_when_given(idp):
    idp.set_account("alice", groups="acme-admins")
    claims = verified(idp, id_token_of(idp, nonce="n"))
    assert claims["groups"] == "acme-admins"
    assert claims["amr"] == ["pwd"]
    assert "acr" not in claims and "email" not in claims


def test_the_next_sign_in_carries_the_groups_the_account_has_then_without_asking_again(idp):
    idp.set_account("alice", groups=["acme-members"])
    assert verified(idp, id_token_of(idp, nonce="first"))["groups"] == ["acme-members"]

    idp.set_account("alice", groups=["acme-admins", "globex-viewers"])
    again = authorize(idp, nonce="second")
    assert not again.asked_for_password  # the provider's session still holds alice
    assert verified(idp, token_response(idp, again.code)["id_token"])["groups"] == [
        "acme-admins",
        "globex-viewers",
    ]


def test_an_account_removed_while_signed_in_is_asked_for_its_password_again(idp):
    idp.set_account("alice")
    assert authorize(idp).asked_for_password
    idp.remove_account("alice")

    params = {"client_id": idp.client_id, "response_type": "code", "scope": SCOPE, "redirect_uri": CALLBACK}
    answer = idp.session.get(idp.authorization_endpoint, params=params)
    assert Page(answer.text).form_with("password") is not None
    idp.set_account("alice", groups=["back"])
    assert verified(idp, id_token_of(idp, nonce="n"))["groups"] == ["back"]


def test_the_client_may_authenticate_with_basic_and_may_send_pkce(idp):
    idp.set_account("alice")
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    authorized = authorize(idp, code_challenge=challenge, code_challenge_method="S256")
    tokens = token_response(idp, authorized.code, basic=True, code_verifier=verifier)
    assert verified(idp, tokens["id_token"])["sub"] == "alice"


def test_a_redirect_uri_added_while_the_provider_runs_is_honoured(idp):
    idp.set_account("alice")
    live = "http://127.0.0.1:8123/accounts/oidc/oidc/login/callback/"
    refused = idp.session.get(
        idp.authorization_endpoint,
        params={"client_id": idp.client_id, "response_type": "code", "scope": "openid", "redirect_uri": live},
        allow_redirects=False,
    )
    assert refused.status_code == 400 and "redirect_uri" in refused.text

    idp.add_redirect_uri(live)
    authorized = authorize(idp, redirect_uri=live)
    assert (
        verified(idp, token_response(idp, authorized.code, redirect_uri=live)["id_token"])["sub"] == "alice"
    )


@pytest.mark.parametrize(
    ("mode", "error"),
    [("issuer", jwt.InvalidIssuerError), ("audience", jwt.InvalidAudienceError),
     ("expired", jwt.ExpiredSignatureError), ("signature", jwt.InvalidSignatureError),
     ("unsigned", jwt.InvalidAlgorithmError)],
)  # fmt: skip
def test_each_tamper_mode_spoils_the_id_token_as_it_says_and_nothing_else(idp, mode, error):
    idp.set_account("alice", email="alice@acme.test")
    idp.tamper(mode)
    id_token = id_token_of(idp, nonce="tampered")

    with pytest.raises(error):
        verified(idp, id_token)
    published = {key["kid"] for key in requests.get(idp.jwks_uri, timeout=10).json()["keys"]}
    assert jwt.get_unverified_header(id_token)["kid"] in published
    claims = jwt.decode(id_token, options={"verify_signature": False})
    assert (claims["sub"], claims["nonce"], claims["email"]) == ("alice", "tampered", "alice@acme.test")
    assert (claims["iss"] != idp.issuer) is (mode == "issuer")
    assert (claims["aud"] != idp.client_id) is (mode == "audience")

    idp.tamper(None)
    assert verified(idp, id_token_of(idp, nonce="clean"))["nonce"] == "clean"


def test_replay_answers_with_the_previous_sign_ins_id_token(idp):
    idp.set_account("alice")
    earlier = id_token_of(idp, nonce="earlier")
    idp.tamper("replay")

    replayed = id_token_of(idp, nonce="later")
    assert replayed == earlier
    assert verified(idp, replayed)["nonce"] == "earlier"


def test_replay_has_nothing_to_replay_in_a_tests_first_sign_in(idp):
    idp.set_account("alice")
    idp.tamper("replay")
    answer = requests.post(
        idp.token_endpoint,
        data={"grant_type": "authorization_code", "code": authorize(idp).code, "redirect_uri": CALLBACK,
              "client_id": idp.client_id, "client_secret": idp.client_secret},
        timeout=10,
    )  # fmt: skip
    assert answer.status_code == 500
    assert answer.json()["error_description"] == 'tamper "replay": no earlier ID token in this test to replay'


def test_a_wrong_password_or_an_unknown_login_shows_the_form_again_with_an_error(idp):
    idp.set_account("alice", password="right")
    params = {"client_id": idp.client_id, "response_type": "code", "scope": SCOPE, "redirect_uri": CALLBACK}
    answer = idp.session.get(idp.authorization_endpoint, params=params)  # to the login form
    page = Page(answer.text)
    assert "<title>Test identity provider — sign in</title>" in answer.text
    assert not page.alerts
    form = page.form_with("password")
    assert set(form.fields) == {"login", "password"} and form.method == "post"

    for login, password in [("alice", "wrong"), ("bob", "right")]:
        again = idp.session.post(
            urljoin(answer.url, form.action), data={"login": login, "password": password}
        )
        assert again.status_code == 200
        shown = Page(again.text)
        assert shown.alerts == ["Unknown login or wrong password."]
        assert shown.form_with("password").fields["login"] == login


def test_end_session_signs_out_and_sends_the_browser_to_the_post_logout_uri(idp):
    idp.set_account("alice")
    id_token = id_token_of(idp, nonce="n")
    query = urlencode({"id_token_hint": id_token, "post_logout_redirect_uri": POST_LOGOUT, "state": "bye"})

    assert sign_out_at_provider(idp, f"{idp.end_session_endpoint}?{query}") == f"{POST_LOGOUT}?state=bye"
    assert authorize(idp).asked_for_password  # the provider's session is gone


class StandInPortal:
    """The portal's two URLs as sign_in sees them: the start URL sends the browser to the provider, the
    callback answers with nothing but remembers what it was given."""

    def __init__(self, idp):
        self.idp = idp
        self.state = secrets.token_urlsafe(8)
        self.callback: dict = {}

    def post(self, path, data):
        assert path == START
        params = {"client_id": self.idp.client_id, "response_type": "code", "scope": SCOPE,
                  "redirect_uri": CALLBACK, "state": self.state, "nonce": "n"}  # fmt: skip
        return HttpResponseRedirect(f"{self.idp.authorization_endpoint}?{urlencode(params)}")

    def get(self, path):
        parts = urlsplit(path)
        assert parts.path == urlsplit(CALLBACK).path
        self.callback = parse_qs(parts.query)
        return HttpResponse("signed in")


def test_sign_in_walks_from_the_portals_start_to_its_callback_asking_for_the_password_once(idp):
    idp.set_account("alice")
    portal = StandInPortal(idp)

    first = sign_in(portal, idp, "alice")
    assert first.content == b"signed in"
    assert portal.callback["state"] == [portal.state] and portal.callback["code"]
    assert any("/interaction/" in url for url in first.visited)
    assert first.visited[0].startswith(idp.authorization_endpoint) and first.visited[-1].startswith(CALLBACK)

    again = sign_in(portal, idp, "alice", password="not asked")
    assert [urlsplit(url).path for url in again.visited] == ["/auth", urlsplit(CALLBACK).path]

    idp.forget_session()
    with pytest.raises(AssertionError, match="refused 'alice': Unknown login or wrong password"):
        sign_in(portal, idp, "alice", password="wrong")
