"""bench/load.py's simulated people: each signs in over HTTP as a browser does (the sign-in form, its
session cookie and CSRF token) and goes round the pages of their role, each request timed:

- tenant members open their tenant page, its pools and requests, the request form, submit a request for
  one full GPU, and release one of their active pools;
- approvers open /approvals/, a request awaiting a decision, and approve it (each approver takes its own
  share of the requests, so that two never race for one);
- operators open /capacity/ and a group of GPUs.
"""

from __future__ import annotations

import asyncio
import random
import re
import time
from dataclasses import dataclass, field

from bench.load_figures import Sample

PASSWORD = "load-password"  # every simulated tenant member's
STAFF_PASSWORD = "demo-password"  # the demo's staff, carol and erin
SPEC = "h200-141gb.full"  # what tenants ask for: one full GPU of the benchmark's cluster
CLUSTER = "load"

CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


@dataclass
class User:
    """One simulated person: who signs in, as what, and what they have met."""

    username: str
    role: str  # tenant | approver | operator
    tenant: str = ""
    share: tuple[int, int] = (0, 1)  # an approver takes the requests whose id % share[1] == share[0]
    samples: list[Sample] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class Browser:
    """A user's session over HTTP: cookies kept, each request timed under a page's name."""

    def __init__(self, session, base: str, user: User, think: float):
        self.session, self.base, self.user, self.think = session, base, user, think
        self.recording = False

    async def open(self, page: str, path: str, *, data: dict | None = None, expect: int | None = None):
        """GET (or POST `data` with the page's CSRF token) and record it; returns (status, body, location)."""
        expect = expect or (302 if data is not None else 200)
        if data is not None:
            data = {**data, "csrfmiddlewaretoken": self.csrf}
        started = time.perf_counter()
        method = self.session.post if data is not None else self.session.get
        async with method(self.base + path, data=data, allow_redirects=False) as response:
            body = await response.text()
            status, location = response.status, response.headers.get("Location", "")
        elapsed = time.perf_counter() - started
        ok = status == expect
        if self.recording:
            self.user.samples.append(Sample(page, elapsed, ok))
        if not ok and len(self.user.failures) < 5:
            self.user.failures.append(f"{page} {path}: {status} (expected {expect})")
        if found := CSRF.search(body):
            self.csrf = found.group(1)
        if self.recording and self.think:
            await asyncio.sleep(random.uniform(0, 2 * self.think))
        return status, body, location

    async def sign_in(self, password: str) -> None:
        await self.open("sign in", "/accounts/login/")
        status, _body, _location = await self.open(
            "sign in", "/accounts/login/", data={"login": self.user.username, "password": password}
        )
        if status != 302:
            raise RuntimeError(f"{self.user.username} could not sign in ({status}): {self.user.failures}")


def ids(pattern: str, body: str) -> list[int]:
    return sorted({int(n) for n in re.findall(pattern, body)})


async def tenant_round(browser: Browser) -> None:
    slug = browser.user.tenant
    await browser.open("tenant page", f"/t/{slug}/")
    await browser.open("pools list", f"/t/{slug}/pools/")
    await browser.open("requests list", f"/t/{slug}/requests/")
    form = f"/t/{slug}/p/train/request/"
    await browser.open("request form", form)
    await browser.open(
        "submit request",
        form,
        data={
            "spec_0": SPEC,
            "count_0": "1",
            "cluster": CLUSTER,
            "purpose": "",
            "justification": "Load test.",
        },
    )
    _status, body, _location = await browser.open("pools list (active)", f"/t/{slug}/pools/?state=active")
    active = ids(rf'href="/t/{re.escape(slug)}/pools/(\d+)/"', body)
    if active:
        pool = f"/t/{slug}/pools/{active[0]}/"
        await browser.open("pool page", pool)
        await browser.open("release pool", pool + "release/", data={})


async def approver_round(browser: Browser) -> None:
    _status, body, _location = await browser.open("approvals", "/approvals/")
    mine, of = browser.user.share
    waiting = [n for n in ids(r'href="/approvals/(\d+)/"', body) if n % of == mine]
    if waiting:
        await browser.open("approval page", f"/approvals/{waiting[0]}/")
        await browser.open("approve", f"/approvals/{waiting[0]}/approve/", data={"priority": ""})


async def operator_round(browser: Browser) -> None:
    _status, body, _location = await browser.open("capacity", "/capacity/")
    groups = re.findall(r'href="(/capacity/clusters/\d+/groups/[^/"]+/)"', body)
    if groups:
        await browser.open("capacity group", random.choice(groups))


ROUNDS = {"tenant": tenant_round, "approver": approver_round, "operator": operator_round}


def cast(users: int) -> list[User]:
    """Who the `users` are: a tenth approvers, a tenth operators (at least one of each), the rest tenant
    members, each of their own tenant."""
    staff = max(1, users // 10)
    approvers = [User("carol", "approver", share=(k, staff)) for k in range(staff)]
    operators = [User("erin", "operator") for _ in range(staff)]
    members = [User(f"load{n}", "tenant", tenant=f"load-{n}") for n in range(max(0, users - 2 * staff))]
    return approvers + operators + members


async def simulate(base: str, people: list[User], *, seconds: float, think: float) -> float:
    """Sign everyone in, then let them work for `seconds`; returns the seconds actually measured."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=60)
    sessions = [
        aiohttp.ClientSession(
            cookie_jar=aiohttp.CookieJar(unsafe=True),  # cookies of 127.0.0.1 too
            timeout=timeout,
            headers={"X-Forwarded-For": f"10.0.{n // 250}.{n % 250 + 1}"},
        )
        for n in range(len(people))
    ]
    try:
        browsers = [Browser(s, base, user, think) for s, user in zip(sessions, people, strict=True)]
        passwords = {"carol": STAFF_PASSWORD, "erin": STAFF_PASSWORD}
        await asyncio.gather(*(b.sign_in(passwords.get(b.user.username, PASSWORD)) for b in browsers))
        # One unrecorded round each first: every gunicorn worker loads its code and templates once.
        await asyncio.gather(*(ROUNDS[b.user.role](b) for b in browsers))
        for browser in browsers:
            browser.user.failures.clear()
            browser.recording = True
        deadline = time.monotonic() + seconds
        started = time.monotonic()

        async def work(browser: Browser) -> None:
            await asyncio.sleep(random.uniform(0, think))  # not all at once
            while time.monotonic() < deadline:
                await ROUNDS[browser.user.role](browser)

        tasks = [asyncio.create_task(work(b)) for b in browsers]
        await asyncio.wait(tasks, timeout=seconds + 60)
        for task in tasks:
            task.cancel()
        return time.monotonic() - started
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
