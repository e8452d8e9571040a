"""Shared fixtures of the journeys: a real browser (Debian's Chromium, driven by playwright) on the live
server, a real worker on the simulated fleet, in English and in Korean; a journey fails on any console
error, page error, failed request or request to another host, and saves its key steps as screenshots."""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.db import connections
from django.urls import reverse

from tests.factories import PASSWORD, totp_code

CHROMIUM = Path("/usr/bin/chromium")
try:
    from playwright import sync_api
except ImportError:  # the journeys are skipped, the rest of the suite runs
    sync_api = None

# A test module of journeys marks itself with this: skipped without Chromium, and its live server reads
# what the test writes (committed rows, the database put back as it was after).
JOURNEY = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Chromium at /usr/bin/chromium"),
    pytest.mark.skipif(sync_api is None, reason="needs playwright (requirements-dev.txt)"),
    pytest.mark.django_db(transaction=True, serialized_rollback=True),
    pytest.mark.celery,
]
LOCALES = {"en": "en-GB", "ko": "ko-KR"}
HANGUL = re.compile("[\uac00-\ud7a3]")
FLEET = [
    ("h200", 1, "H200-141GB", [{"1g.18gb": 7}, None]),
    ("h100", 1, "H100-80GB", [None, None]),
]
WAIT_MS = 30_000  # the longest a step waits for the worker


def settle() -> None:
    """Beside playwright's loop the test's queries get a connection of their own; close it, so that nothing
    holds the test database while the live server and the worker use it."""
    connections.close_all()


@dataclass
class Journey:
    """One browser tab on the live server, in one language."""

    page: object
    context: object
    base: str
    lang: str
    name: str
    shots: Path
    errors: list[str] = field(default_factory=list)
    step: int = 0

    def url(self, name: str, **kwargs) -> str:
        return self.base + reverse(name, kwargs=kwargs or None)

    def go(self, name: str, **kwargs) -> None:
        self.page.goto(self.url(name, **kwargs))
        self.check_language()

    def check_language(self) -> None:
        """The page is in the journey's language: `<html lang>` says so, and in Korean the words are."""
        assert self.page.locator("html").get_attribute("lang") == self.lang, self.page.url
        # The language menu names Korean in Korean on every page: read the page's own part only.
        korean = HANGUL.search(self.page.locator("main").inner_text()) is not None
        assert korean == (self.lang == "ko"), self.page.url

    def shot(self, what: str) -> Path:
        self.step += 1
        path = self.shots / f"{self.name}-{self.lang}-{self.step:02d}-{what}.png"
        self.page.screenshot(path=path, full_page=True)
        return path

    def sign_in(self, username: str, *, totp_secret: str | None = None, next_url: str = "/") -> None:
        """Through the sign-in form (and the two-factor form when the person has TOTP on)."""
        self.page.goto(self.base + reverse("account_login") + f"?next={next_url}")
        self.check_language()
        self.page.fill("input[name=login]", username)
        self.page.fill("input[name=password]", PASSWORD)
        self.page.click(f"form[action='{reverse('account_login')}'] button[type=submit]")
        if totp_secret is not None:
            self.page.wait_for_url(f"**{reverse('mfa_authenticate')}*")
            self.check_language()
            self.shot("two-factor")
            self.page.fill("input[name=code]", totp_code(totp_secret))
            self.page.click("form button[type=submit]")
        self.page.wait_for_url(lambda url: reverse("account_login") not in url and "/2fa/" not in url)
        self.check_language()

    def sign_in_with_cookie(self, client, user, settings) -> None:
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME].value
        self.context.add_cookies([{"name": settings.SESSION_COOKIE_NAME, "value": cookie, "url": self.base}])
        settle()

    def reload_until(self, ready, *, timeout_ms: int = WAIT_MS) -> None:
        """Reload the page until `ready()` holds (for pages that do not refresh themselves)."""
        waited = 0
        while not ready():
            assert waited < timeout_ms, f"{self.page.url} did not get there in time"
            self.page.wait_for_timeout(300)
            waited += 300
            self.page.reload()


@pytest.fixture(params=list(LOCALES))
def lang(request) -> str:
    return request.param


@pytest.fixture
def screenshots(tmp_path) -> Path:
    """Where the journeys' screenshots go: $JOURNEY_SCREENSHOTS (to refresh those of the README), else a
    folder of the test's own, so that a run writes nothing into the repository."""
    chosen = os.environ.get("JOURNEY_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def fleet(synced):
    """A simulated cluster: h200-1 (GPU 0 cut in 7 × 1g.18gb, GPU 1 whole), h100-1 (two whole GPUs)."""
    return synced(FLEET)


@pytest.fixture
def journey_other_hosts() -> tuple[str, ...]:
    """Hosts (host:port) besides the live server a journey may reach: none, unless a module says (the
    identity provider of the single sign-on journey)."""
    return ()


@pytest.fixture
def journey(request, lang, live_server, screenshots, monkeypatch, settings, journey_other_hosts):
    """A browser tab on the live server in `lang`, failing the test on any script or console error, any
    failed request, any answer of 400 or more, and any request to a host other than the live server (and
    `journey_other_hosts`)."""
    monkeypatch.setattr("pools.views.refresh.REFRESH_SECONDS", 1)
    # The live server serves static files from the apps' folders by their plain names.
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    # playwright's sync API runs an event loop in this thread; the test's own queries run beside it.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    settle()
    host = urlsplit(live_server.url).netloc
    name = request.node.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        context = browser.new_context(
            locale=LOCALES[lang], accept_downloads=True, viewport={"width": 1280, "height": 900}
        )
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        tab = Journey(page, context, live_server.url, lang, name, screenshots)
        page.on("pageerror", lambda error: tab.errors.append(f"page error: {error}"))
        page.on("console", lambda m: m.type == "error" and tab.errors.append(f"console: {m.text}"))
        page.on("response", lambda r: r.status >= 400 and tab.errors.append(f"{r.status} {r.url}"))

        def requested(req) -> None:
            parts = urlsplit(req.url)
            if parts.scheme in ("http", "https", "ws", "wss") and parts.netloc not in (
                host,
                *journey_other_hosts,
            ):
                tab.errors.append(f"request to another host: {req.url}")

        failed: list = []
        downloads: set[str] = set()
        page.on("request", requested)
        page.on("requestfailed", lambda req: failed.append((req.url, req.failure)))
        page.on("download", lambda download: downloads.add(download.url))
        page.on("dialog", lambda dialog: dialog.accept())  # data-confirm: the person says yes
        yield tab
        settle()  # what the test read last, beside playwright's loop
        browser.close()
    settle()
    # A download ends its navigation without a page, which Chromium reports as an aborted request.
    tab.errors += [f"failed: {url} {why}" for url, why in failed if url not in downloads]
    assert tab.errors == []
