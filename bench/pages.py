#!/usr/bin/env python
"""Benchmark: the pages people open most, at 1,000 requests and 8,000 GPUs, next to the home page.

Builds a simulated cluster of 1,000 nodes × 8 H200 GPUs (a quarter of them cut into MIG
instances), 1,000 pool requests of one project in every state, 40 of them admitted as pools,
then opens each page as the person who uses it: queries, and the median time of repeated
loads, with its ratio to the home page measured in the same run, and its size in bytes. The
operators' capacity pages are the overview (figures summed in SQL, no GPU drawn), the first page of
one group's nodes, and one node. The specs API and the request form reuse a picture of the fleet
while capacity does not change; the time to build that picture after a change (the first load
after a sync, admission or release) is printed too.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped):
    .venv/bin/python bench/pages.py [--nodes 1000] [--requests 1000] [--repeat 7]
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DEBUG", "true")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import Group  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.urls import reverse  # noqa: E402

from pools import capacity_version  # noqa: E402
from pools.models import NodeCapacity, PoolRequest, RequestItem, RequestState  # noqa: E402
from pools.services import (  # noqa: E402
    admit_waiting,
    approve_request,
    submit_request,
    sync_inventory,
)
from portal.models import Role  # noqa: E402
from tests.factories import ClusterFactory, MembershipFactory, ProjectFactory, TenantFactory, UserFactory  # noqa: E402

LAYOUTS = [{"1g.18gb": 7}, {"3g.71gb": 2}, None, None, None, None, None, None]
SUMMARY_TIMES_HOME = 10  # what the capacity summary must stay within at 1,000 nodes
# What the capacity overview must stay within at 1,000 nodes: it sums in SQL and draws no GPU.
OVERVIEW_TIMES_HOME = 25
OVERVIEW_BYTES = 1_500_000
STATES = [RequestState.SUBMITTED, RequestState.REJECTED, RequestState.CANCELLED, RequestState.QUEUED]


def build(nodes: int, requests: int):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0
    started = time.perf_counter()
    cluster = ClusterFactory(name="bench", fleet=[("h200", nodes, "H200-141GB", LAYOUTS)])
    sync_inventory(cluster=cluster)
    tenant = TenantFactory(slug="acme", name="Acme")
    project = ProjectFactory(tenant=tenant, slug="vision")
    member = MembershipFactory(tenant=tenant, role=Role.MEMBER, user__username="alice").user
    approver = UserFactory(username="carol", is_staff=True)
    approver.groups.add(Group.objects.get(name="approver"))
    operator = UserFactory(username="root", is_staff=True, is_superuser=True)
    admitted = 40
    for _ in range(admitted):
        request = submit_request(
            project=project, user=member, items=[("h200-141gb.mig-1g.18gb", 2), ("h200-141gb.full", 1)]
        )
        approve_request(request_id=request.pk, approver=approver)
    admit_waiting()
    rest = PoolRequest.objects.bulk_create(
        PoolRequest(project=project, submitted_by=member, state=STATES[n % len(STATES)], purpose="")
        for n in range(requests - admitted)
    )
    RequestItem.objects.bulk_create(
        RequestItem(request=r, gpu_model="H200-141GB", profile="3g.71gb", count=1 + n % 3)
        for n, r in enumerate(rest)
    )
    return member, approver, operator, time.perf_counter() - started


def measure(client: Client, url: str, repeat: int) -> tuple[int, float, int]:
    """(queries of one load, median seconds of `repeat` loads after a warm-up, bytes of the page)."""
    response = client.get(url)
    if response.status_code != 200:
        raise SystemExit(f"{url} answered {response.status_code}")
    size = len(response.content)
    connection.queries_log.clear()  # with DEBUG the log keeps the last 9,000 queries: make room
    with CaptureQueriesContext(connection) as ctx:
        client.get(url)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(url)
        times.append(time.perf_counter() - started)
    return len(ctx), statistics.median(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        member, approver, operator, built = build(args.nodes, args.requests)
        tenant, project = "acme", "vision"
        node = NodeCapacity.objects.filter(cluster__name="bench").order_by("name").first()
        group_page = reverse("capacity-group", kwargs={"pk": node.cluster_id, "group": "none"})
        node_page = reverse("capacity-node", kwargs={"pk": node.pk})
        undecided = PoolRequest.objects.filter(state=RequestState.SUBMITTED).order_by("pk").first()
        pages = [
            ("home", member, reverse("home")),
            ("tenant", member, reverse("tenant", kwargs={"slug": tenant})),
            ("project", member, reverse("project", kwargs={"tenant_slug": tenant, "slug": project})),
            ("tenant request list", member, reverse("tenant-requests", kwargs={"tenant_slug": tenant})),
            ("admin request list", approver, reverse("admin:pools_poolrequest_changelist")),
            ("approvals queue (25 verdicts)", approver, reverse("approvals")),
            ("approval page", approver, reverse("approval", kwargs={"pk": undecided.pk})),
            ("capacity overview", operator, reverse("capacity-dashboard")),
            ("capacity group page", operator, group_page),
            ("capacity node page", operator, node_page),
            ("capacity summary API", operator, reverse("v1:capacity-summary")),
            ("specs API", member, reverse("v1:specs")),
            (
                "request form",
                member,
                reverse("pool-request-new", kwargs={"tenant_slug": tenant, "slug": project}),
            ),
        ]
        figures = []
        for name, user, url in pages:
            client = Client()
            client.force_login(user)
            figures.append((name, *measure(client, url, args.repeat)))
        client = Client()
        client.force_login(member)
        capacity_version.changed()  # as after a sync, admission or release
        started = time.perf_counter()
        client.get(reverse("v1:specs"))
        rebuilt = time.perf_counter() - started
    finally:
        teardown_databases(databases, verbosity=0)
    print(
        f"fleet: {args.nodes} nodes, {args.nodes * 8} GPUs; {args.requests} requests (built in {built:.0f} s)"
    )
    home = figures[0][2]
    for name, queries, seconds, size in figures:
        print(
            f"{name}: {queries} queries, median {seconds * 1000:.1f} ms ({seconds / home:.1f}× home), "
            f"{size} bytes"
        )
    overview = next(f for f in figures if f[0] == "capacity overview")
    print(
        f"capacity overview within {OVERVIEW_TIMES_HOME}× home: {overview[2] / home <= OVERVIEW_TIMES_HOME}; "
        f"under {OVERVIEW_BYTES} bytes: {overview[3] < OVERVIEW_BYTES}"
    )
    summary = next(f for f in figures if f[0] == "capacity summary API")
    print(f"capacity summary within {SUMMARY_TIMES_HOME}× home: {summary[2] / home <= SUMMARY_TIMES_HOME}")
    print(
        f"specs API, first load after a capacity change: {rebuilt * 1000:.0f} ms ({rebuilt / home:.0f}× home)"
    )


if __name__ == "__main__":
    main()
