"""The test identity provider (tests/oidc/provider.mjs, a real oidc-provider in its own Node.js process) as
fixtures, and a sign-in through it driven over HTTP.

- `identity_provider`: one provider per test process (each xdist worker starts its own, on a port of its own),
  started on first use and stopped at the end of the session.
- `idp`: the same provider for one test, put back to its defaults before and after it (one client, no
  account, no defect, its own session forgotten).
- `sign_in(portal, idp, login)`: the portal's sign-in with the provider, from the portal's start URL to its
  callback, as a browser would walk it; `sign_out_at_provider(idp, url)`: the provider's end-session page.

What the provider knows (clients, accounts, `tamper`) lives in a JSON file it reads at each use, so a test
changes it while the provider runs: `idp.set_account("alice", email=..., groups=[...])`.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
import requests

HERE = Path(__file__).resolve().parent
PROVIDER = HERE / "provider.mjs"
INSTALLED = HERE / "node_modules" / "oidc-provider" / "package.json"

CLIENT_ID = "portal"
CALLBACK = "http://testserver/accounts/oidc/oidc/login/callback/"
POST_LOGOUT = "http://testserver/"
START = "/accounts/oidc/oidc/login/"
PASSWORD = "secret"
# What `tamper` does to the ID token of each token response (tests/oidc/provider.mjs: tampered).
TAMPERS = {
    "issuer": "re-signed with the provider's key, `iss` another URL",
    "audience": "re-signed with the provider's key, `aud` another client",
    "expired": "re-signed with the provider's key, `iat` and `exp` in the past",
    "signature": "signed by another RSA key under the same `kid`",
    "unsigned": "no signature: `alg` none, the `kid` kept",
    "replay": "the previous token response's ID token (an earlier sign-in's nonce)",
}
STEPS = 20  # redirects and forms a sign-in or sign-out may take at the provider


class IdentityProvider:
    """A running test identity provider: its issuer, the portal's client there, what it is told (written to
    its file at each change), and the session a test's browser would hold with it (`session`)."""

    def __init__(self, *, config: Path, log: Path):
        self.config = config
        self.log = log
        self.issuer = ""
        self.client_id = CLIENT_ID
        self.client_secret = secrets.token_urlsafe(24)
        self.session = requests.Session()
        self.visited: list[str] = []  # the URLs the last sign_in went through
        self._settings: dict = {}
        self._discovery: dict | None = None
        self.reset()

    # What the provider publishes.
    @property
    def discovery(self) -> dict:
        if self._discovery is None:
            answer = requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=10)
            answer.raise_for_status()
            self._discovery = answer.json()
        return self._discovery

    @property
    def authorization_endpoint(self) -> str:
        return self.discovery["authorization_endpoint"]

    @property
    def token_endpoint(self) -> str:
        return self.discovery["token_endpoint"]

    @property
    def end_session_endpoint(self) -> str:
        return self.discovery["end_session_endpoint"]

    @property
    def jwks_uri(self) -> str:
        return self.discovery["jwks_uri"]

    def owns(self, url: str) -> bool:
        """Whether `url` is one of the provider's own (anything else is where it sends the browser back)."""
        mine, theirs = urlsplit(self.issuer), urlsplit(url)
        return (theirs.scheme, theirs.netloc) == (mine.scheme, mine.netloc)

    # What the provider is told.
    def set_account(self, login: str, *, password: str = PASSWORD, **claims) -> None:
        """Creates or replaces the account `login` (its `sub`). Claims: email, email_verified, name,
        given_name, family_name, preferred_username, groups (any JSON value, sent as given), amr (default
        ["pwd"]) and acr (sent only when given). Each claim not given is left out of the tokens."""
        self._settings["accounts"][login] = {"password": password, "amr": ["pwd"], **claims}
        self._write()

    def remove_account(self, login: str) -> None:
        self._settings["accounts"].pop(login, None)
        self._write()

    def add_redirect_uri(self, uri: str) -> None:
        self._add_to_client("redirect_uris", uri)

    def add_post_logout_redirect_uri(self, uri: str) -> None:
        self._add_to_client("post_logout_redirect_uris", uri)

    def tamper(self, mode: str | None) -> None:
        """Makes every later token response carry a defective ID token (`TAMPERS`), or none (None)."""
        if mode is not None and mode not in TAMPERS:
            raise ValueError(f"{mode!r} is none of {sorted(TAMPERS)}")
        self._settings["tamper"] = mode
        self._write()

    def forget_session(self) -> None:
        """Drops the provider's session cookie, as a fresh browser: the next sign-in asks for a password."""
        self.session.close()
        self.session = requests.Session()

    def reset(self) -> None:
        """Back to the defaults: the portal's client alone (callback and post-logout URI on testserver), no
        account, no defect, no session with the provider."""
        self._settings = {
            "clients": [
                {
                    "client_id": self.client_id,
                    "client_secret": self.client_secret,
                    "redirect_uris": [CALLBACK],
                    "post_logout_redirect_uris": [POST_LOGOUT],
                }
            ],
            "accounts": {},
            "tamper": None,
            "generation": secrets.token_hex(8),  # `replay` replays no ID token of an earlier test
        }
        self._write()
        self.forget_session()
        self.visited = []

    def _add_to_client(self, key: str, uri: str) -> None:
        uris = self._settings["clients"][0][key]
        if uri not in uris:
            uris.append(uri)
            self._write()

    def _write(self) -> None:
        # Whole or not at all: the provider reads the file at any moment.
        partial = self.config.with_name(self.config.name + ".partial")
        partial.write_text(json.dumps(self._settings, indent=2))
        os.replace(partial, self.config)


@contextmanager
def running_identity_provider(workdir: Path, *, timeout: float = 30) -> Iterator[IdentityProvider]:
    """A test identity provider process on a free port of 127.0.0.1, its file and log in `workdir`."""
    node = shutil.which("node")
    if node is None or not INSTALLED.exists():
        pytest.fail(
            "The test identity provider needs Node.js and its npm packages (tests/oidc/node_modules): "
            "run ./scripts/test, which installs tests/oidc (npm ci --prefix tests/oidc)."
        )
    provider = IdentityProvider(config=workdir / "provider.json", log=workdir / "provider.log")
    with provider.log.open("wb") as log:
        # Port 0: the provider listens on a free port and says which, so parallel test processes never race
        # for one.
        process = subprocess.Popen(
            [node, str(PROVIDER), "--port", "0", "--config", str(provider.config)],
            cwd=HERE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        provider.issuer = _wait_until_ready(process, provider.log, timeout)
        yield provider
    finally:
        provider.session.close()
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_ready(process: subprocess.Popen, log: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    issuer = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"The test identity provider exited ({process.returncode}):\n{log.read_text()[-3000:]}"
            )
        if issuer is None:
            ready = re.search(r"^ready (http://127\.0\.0\.1:\d+)$", log.read_text(), re.MULTILINE)
            issuer = ready and ready.group(1)
        if issuer is not None:
            with suppress(requests.RequestException):
                answer = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=2)
                if answer.status_code == 200 and answer.json().get("issuer") == issuer:
                    return issuer
        time.sleep(0.05)
    pytest.fail(f"The test identity provider was not ready after {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def identity_provider(tmp_path_factory) -> Iterator[IdentityProvider]:
    with running_identity_provider(tmp_path_factory.mktemp("identity-provider")) as provider:
        yield provider


@pytest.fixture
def idp(identity_provider: IdentityProvider) -> Iterator[IdentityProvider]:
    """The test identity provider for one test, at its defaults before and after."""
    identity_provider.reset()
    yield identity_provider
    identity_provider.reset()


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)


class Page(HTMLParser):
    """The forms of an HTML page, with their fields' values, and the text of its alerts (`role="alert"`)."""

    def __init__(self, html: str):
        super().__init__()
        self.forms: list[Form] = []
        self.alerts: list[str] = []
        self._alert_depth = 0
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        attributes = {name: value or "" for name, value in attrs}
        if tag == "form":
            self.forms.append(Form(attributes.get("action", ""), attributes.get("method", "get").lower()))
        elif tag == "input" and self.forms and attributes.get("name"):
            self.forms[-1].fields[attributes["name"]] = attributes.get("value", "")
        if self._alert_depth:
            self._alert_depth += 1
        elif attributes.get("role") == "alert":
            self._alert_depth = 1
            self.alerts.append("")

    def handle_endtag(self, tag):
        if self._alert_depth:
            self._alert_depth -= 1

    def handle_data(self, data):
        if self._alert_depth:
            self.alerts[-1] += data

    def form_with(self, name: str) -> Form | None:
        return next((form for form in self.forms if name in form.fields), None)


def sign_in(
    portal,
    idp: IdentityProvider,
    login: str,
    password: str = PASSWORD,
    *,
    start: str = START,
    next: str | None = None,
):
    """Signs in with the identity provider: POSTs to the portal's `start` URL (with `next`), walks the
    provider's redirects one at a time with `idp.session`, posts `login` and `password` to its login form
    when it asks (not at all where the provider's session already holds someone), and GETs the portal's
    callback with `portal` (a django.test.Client). Returns the portal's answer to its callback, unfollowed,
    with `visited` (also `idp.visited`): every URL from the provider's authorization endpoint to the
    callback. An AssertionError says where the walk broke off, or the provider's words when it refused."""
    answer = portal.post(start, {} if next is None else {"next": next})
    location = answer.get("Location", "")
    assert answer.status_code == 302 and location.startswith(idp.authorization_endpoint), (
        f"POST {start} answered {answer.status_code} {location!r}, not a redirect to "
        f"{idp.authorization_endpoint}"
    )
    visited = [location]
    at_provider = idp.session.get(location, allow_redirects=False)
    submitted = False
    for _ in range(STEPS):
        if at_provider.is_redirect:
            location = urljoin(at_provider.url, at_provider.headers["Location"])
            visited.append(location)
            if not idp.owns(location):
                break
            at_provider = idp.session.get(location, allow_redirects=False)
            continue
        page = Page(at_provider.text)
        form = page.form_with("password")
        if form is None:
            raise AssertionError(
                f"The identity provider answered {at_provider.status_code} at {at_provider.url}:\n"
                f"{at_provider.text[:2000]}"
            )
        if submitted:
            raise AssertionError(f"The identity provider refused {login!r}: {' '.join(page.alerts)}")
        at_provider = idp.session.post(
            urljoin(at_provider.url, form.action),
            data={**form.fields, "login": login, "password": password},
            allow_redirects=False,
        )
        submitted = True
    else:
        raise AssertionError(f"No way back to the portal after {STEPS} steps: {visited}")
    callback = urlsplit(location)
    response = portal.get(callback.path + (f"?{callback.query}" if callback.query else ""))
    response.visited = idp.visited = visited
    return response


def sign_out_at_provider(idp: IdentityProvider, url: str) -> str:
    """Follows the end-session URL `url` (the portal's redirect to the provider's end_session_endpoint) with
    `idp.session`: its confirmation form posted as a browser would. Returns where the provider sends the
    browser at the end: the post-logout redirect URI, or its own signed-out page's URL."""
    location = url
    answer = idp.session.get(location, allow_redirects=False)
    for _ in range(STEPS):
        if answer.is_redirect:
            location = urljoin(answer.url, answer.headers["Location"])
            if not idp.owns(location):
                return location
            answer = idp.session.get(location, allow_redirects=False)
            continue
        assert answer.status_code == 200, (
            f"The identity provider answered {answer.status_code}:\n{answer.text}"
        )
        forms = Page(answer.text).forms
        if not forms:
            return location
        form = forms[0]
        answer = idp.session.post(urljoin(answer.url, form.action), data=form.fields, allow_redirects=False)
    raise AssertionError(f"The identity provider's sign-out took more than {STEPS} steps")


def trust(settings, idp: IdentityProvider, **environ: str) -> list[dict]:
    """The portal's settings (pytest-django's `settings`) trusting `idp` as provider `oidc`, named "Corp ID",
    with its groups asked for and its origin a target of the portal's forms; `environ` adds or overrides
    variables of portal/sso/config.py. Returns the providers as the settings hold them."""
    from portal.sso.config import provider_apps, provider_origins

    apps = provider_apps(
        {
            "OIDC_ISSUER": idp.issuer,
            "OIDC_CLIENT_ID": idp.client_id,
            "OIDC_CLIENT_SECRET": idp.client_secret,
            "OIDC_NAME": "Corp ID",
            "OIDC_SCOPES": "openid profile email groups",
            **environ,
        }
    )
    settings.SOCIALACCOUNT_PROVIDERS = {
        "openid_connect": {**settings.SOCIALACCOUNT_PROVIDERS["openid_connect"], "APPS": apps}
    }
    policy = settings.CONTENT_SECURITY_POLICY
    directives = {**policy["DIRECTIVES"], "form-action": ["'self'", *provider_origins(apps)]}
    settings.CONTENT_SECURITY_POLICY = {**policy, "DIRECTIVES": directives}
    return apps
