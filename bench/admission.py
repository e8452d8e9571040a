#!/usr/bin/env python
"""Benchmark: one run of the admission queue (pools.services.queue.admit_waiting) as its waiting list grows.

Builds simulated clusters of H200 nodes (`--clusters`, one unless told; GPU 0 of each node cut into
7 × 1g.18gb, GPU 1 into 2 × 3g.71gb, six whole), takes every whole GPU (a request per cluster: one request
asks for at most 10,000) and a 1g instance per node, then approves one request that cannot fit (more whole
GPUs than any cluster has left) and lets it starve past the grace. Behind it wait N requests, a quarter of
each: one whole GPU (held back at once: it could never keep out of the starving one's way), one 3g.71gb
(placed, then held back: it would take a wholly free GPU), one 1g.18gb (placed and admitted beside the
first tenant, while free instances last) and twenty 1g.18gb (placed, then held back: they need a new
layout). Each run is rolled back, so every repeat sees the same queue.

Prints, per waiting-list length, for the first run after the requests were approved (each one then moves to
`queued` with its reason) and for a later run (each already queued, nothing to write): the median time of
one run, its time per waiting request, its queries (and per waiting request), how many requests the engine
placed and how many were admitted.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL, Redis per
REDIS_URL / CACHE_URL; a throwaway test database is created and dropped):
    .venv/bin/python bench/admission.py [--nodes 50] [--waiting 50 200 500] [--repeat 3] [--clusters 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
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
from django.db import connection, transaction  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402

from pools import conf  # noqa: E402
from pools.models import PoolRequest, RequestItem  # noqa: E402
from pools.services import admit_waiting, approve_request, queue, submit_request  # noqa: E402
from pools.services.inventory import sync_inventory  # noqa: E402
from pools.services.requests import MAX_COUNT  # noqa: E402
from portal.models import Role  # noqa: E402
from tests.factories import ClusterFactory, MembershipFactory, ProjectFactory, TenantFactory, UserFactory  # noqa: E402

LAYOUTS = [{"1g.18gb": 7}, {"3g.71gb": 2}, None, None, None, None, None, None]
BEHIND = [
    [("h200-141gb.full", 1)],
    [("h200-141gb.mig-3g.71gb", 1)],
    [("h200-141gb.mig-1g.18gb", 1)],
    [("h200-141gb.mig-1g.18gb", 20)],
]


def build(nodes: int, waiting: int, clusters: int) -> None:
    settings.SIMULATED_MIG_APPLY_SECONDS = 0
    per = nodes // clusters
    made = []
    for number in range(1, clusters + 1):
        fleet = [(f"h200-c{number}", per, "H200-141GB", LAYOUTS)]
        made.append(ClusterFactory(name=f"bench-{number}", fleet=fleet))
        sync_inventory(cluster=made[-1])
    tenant = TenantFactory(slug="acme", name="Acme")
    project = ProjectFactory(tenant=tenant, slug="vision")
    member = MembershipFactory(tenant=tenant, role=Role.MEMBER, user__username="alice").user
    approver = UserFactory(username="carol", is_staff=True)
    approver.groups.add(Group.objects.get(name="approver"))

    def asked(items, cluster=None) -> PoolRequest:
        request = submit_request(project=project, user=member, items=items, cluster=cluster)
        return approve_request(request_id=request.pk, approver=approver)

    for cluster in made:
        asked([("h200-141gb.full", 6 * per)], cluster)
    copied([asked([("h200-141gb.mig-1g.18gb", 1)])], nodes)
    admit_waiting()
    starving = asked([("h200-141gb.full", 2 * per + 1)])  # more than every MIG GPU of a cluster switched off
    long_ago = timezone.now() - timedelta(seconds=conf.settings.QUEUE_BACKFILL_GRACE_SECONDS + 60)
    PoolRequest.objects.filter(pk=starving.pk).update(approved_at=long_ago)
    copied([asked(items) for items in BEHIND[:waiting]], waiting)


def copied(made: list[PoolRequest], count: int) -> None:
    """Requests up to `count` in all, each a copy of one of `made` (submitted and approved through the
    services) in turn, written at once, each approved a microsecond after the one before."""
    templates = [(request, list(request.items.all())) for request in made]
    first = max(request.approved_at for request in made)
    copies, items = [], []
    for n in range(count - len(made)):
        template, its_items = templates[n % len(templates)]
        copy = copy_of(template)
        copy.approved_at = first + timedelta(microseconds=n + 1)
        copies.append(copy)
        items.append(its_items)
    PoolRequest.objects.bulk_create(copies, batch_size=2000)
    RequestItem.objects.bulk_create(
        [
            RequestItem(request=copy, gpu_model=item.gpu_model, profile=item.profile, count=item.count)
            for copy, its_items in zip(copies, items, strict=True)
            for item in its_items
        ],
        batch_size=2000,
    )


def copy_of(request: PoolRequest) -> PoolRequest:
    """An unsaved copy of a request's fields."""
    fields = PoolRequest._meta.concrete_fields
    return PoolRequest(**{f.attname: getattr(request, f.attname) for f in fields if not f.primary_key})


def one_run() -> tuple[float, int, int, int]:
    """(seconds, queries, requests placed by the engine, requests admitted) of one run, rolled back."""
    placed = [0]
    place = queue.place_request

    def counted(*args, **kwargs):
        placed[0] += 1
        return place(*args, **kwargs)

    queue.place_request = counted
    try:
        queries = [0]

        def count(execute, sql, params, many, context):
            queries[0] += 1
            return execute(sql, params, many, context)

        with transaction.atomic(), connection.execute_wrapper(count):
            started = time.perf_counter()
            results = admit_waiting()
            seconds = time.perf_counter() - started
            transaction.set_rollback(True)
    finally:
        queue.place_request = place
    return seconds, queries[0], placed[0], sum(result.admitted for result in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--waiting", type=int, nargs="+", default=[50, 200, 500])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clusters", type=int, default=1, help="clusters the nodes are split into, equally")
    args = parser.parse_args()
    if args.clusters < 1 or args.nodes % args.clusters:
        parser.error("--clusters: at least 1, and a divisor of --nodes")
    if 6 * args.nodes // args.clusters > MAX_COUNT:
        parser.error(
            f"a request asks for at most {MAX_COUNT} GPUs: give more --clusters (at most 1,666 nodes each)"
        )
    figures = []
    for waiting in args.waiting:
        databases = setup_databases(verbosity=0, interactive=False)
        try:
            build(args.nodes, waiting, args.clusters)
            first = [one_run() for _ in range(args.repeat)]
            admit_waiting()  # kept: every request is now queued with its reason, as between two runs
            later = [one_run() for _ in range(args.repeat)]
        finally:
            teardown_databases(databases, verbosity=0)
        for name, runs in (("the first run after their approval", first), ("a later run", later)):
            seconds = statistics.median(run[0] for run in runs)
            figures.append((waiting, name, seconds, *runs[0][1:]))
    print(
        f"fleet: {args.nodes} nodes, {args.nodes * 8} GPUs in {args.clusters} cluster(s); "
        f"one request starving; median of {args.repeat}"
    )
    for waiting, name, seconds, queries, placed, admitted in figures:
        print(
            f"{waiting} waiting behind it, {name}: {seconds * 1000:.0f} ms, "
            f"{seconds / waiting * 1000:.2f} ms a waiting request, {queries} queries "
            f"({queries / waiting:.2f} a waiting request), {placed} placed by the engine, {admitted} admitted"
        )


if __name__ == "__main__":
    main()
