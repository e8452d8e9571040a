"""Saves a screenshot of each person's workspace from a running demo portal, in Debian's Chromium.

Each shot signs in as a demo person, opens a page (or follows the first link a page offers to the
thing worth showing) and saves `<name>.png`. A page that answers an error, logs a console error, or
is wider than a 360 px phone, stops the run: a screenshot of a broken page is worse than none.

Usage: python scripts/lib/screenshots.py --base http://127.0.0.1:8765 --out docs/screenshots [NAME …]
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "demo-password"  # portal/demo.py
NARROW = 360  # px: the narrowest phone the pages must fit


# The outermost elements reaching past the right edge (none of their ancestors does), as tag.class.
WIDEST = """(edge) => Array.from(document.querySelectorAll("body *"))
  .filter((e) => e.getBoundingClientRect().right > edge + 1
    && !(e.parentElement && e.parentElement.getBoundingClientRect().right > edge + 1))
  .slice(0, 5)
  .map((e) => e.tagName.toLowerCase() + (e.className ? "." + String(e.className).split(" ").join(".") : "")
    + " " + Math.round(e.getBoundingClientRect().right) + "px")"""


@dataclass(frozen=True)
class Shot:
    name: str
    user: str
    path: str
    follow: str = ""  # CSS selector of a link on `path` to open instead (its first match)
    language: str = "en"
    wait_for: str = ""  # CSS selector that must be on the page first (work a worker finishes)


SHOTS = [
    Shot("tenant-overview", "alice", "/t/acme/", wait_for=".badge.pool-active"),
    Shot("tenant-request", "alice", "/t/acme/p/vision/request/"),
    Shot("tenant-pool", "alice", "/t/acme/pools/", follow="table a[href*='/pools/']", wait_for="#manifest"),
    Shot("approver-queue", "carol", "/approvals/"),
    Shot("approver-request", "carol", "/approvals/", follow="table a[href^='/approvals/']"),
    Shot("operator-overview", "erin", "/capacity/"),
    Shot("operator-group", "erin", "/capacity/", follow="table a[href^='/capacity/clusters/']"),
    Shot("operator-node", "erin", "/capacity/", follow="a[href^='/capacity/nodes/']"),
    Shot("operator-monitoring", "erin", "/monitoring/"),
    Shot("finance", "dave", "/billing/"),
    Shot("tenant-overview-ko", "alice", "/t/acme/", language="ko", wait_for=".badge.pool-active"),
    Shot("approver-request-ko", "carol", "/approvals/", follow="table a[href^='/approvals/']", language="ko"),
    Shot("operator-node-ko", "erin", "/capacity/", follow="a[href^='/capacity/nodes/']", language="ko"),
]


def wait_until_up(base: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"{base}/accounts/login/", timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"The portal at {base} did not answer within {seconds:.0f} s.")
            time.sleep(0.5)


def sign_in(page: Page, base: str, user: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=login]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_load_state("networkidle")
    if "/accounts/login/" in page.url:
        sys.exit(f"{user} could not sign in.")


def take(browser, base: str, out: Path, shot: Shot) -> None:
    context = browser.new_context(
        viewport={"width": 1280, "height": 960}, locale="ko-KR" if shot.language == "ko" else "en-GB"
    )
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    sign_in(page, base, shot.user)
    response = page.goto(base + shot.path)
    if shot.follow:
        link = page.locator(shot.follow).first
        response = page.goto(base + link.get_attribute("href"))
    if response is None or response.status >= 400:
        sys.exit(f"{shot.name}: {page.url} answered {response.status if response else 'nothing'}.")
    if shot.wait_for:
        for _attempt in range(60):  # the worker provisions the demo's pools within seconds
            if page.locator(shot.wait_for).count():
                break
            time.sleep(1)
            page.reload()
        else:
            sys.exit(f"{shot.name}: nothing matched {shot.wait_for!r} on {page.url} within a minute.")
    page.wait_for_load_state("networkidle")
    if problems:
        sys.exit(f"{shot.name}: console errors on {page.url}: {problems}")
    page.screenshot(path=str(out / f"{shot.name}.png"))
    print(f"{shot.name}: {page.url}")
    # The same page on a narrow phone: nothing may make the page itself scroll sideways (a wide table
    # scrolls inside its own box).
    page.set_viewport_size({"width": NARROW, "height": 800})
    page.wait_for_timeout(200)
    width = page.evaluate("document.documentElement.scrollWidth")
    wide = page.evaluate(WIDEST, NARROW) if width > NARROW else []
    url = page.url
    context.close()
    if width > NARROW:
        sys.exit(f"{shot.name}: {url} is {width} px wide at {NARROW} px; widest: {wide}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("names", nargs="*", help="only these shots")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    wait_until_up(args.base)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        for shot in SHOTS:
            if not args.names or shot.name in args.names:
                take(browser, args.base, args.out, shot)
        browser.close()


if __name__ == "__main__":
    main()
