#!/usr/bin/env python
"""Benchmark: inventory sync of a large fleet from the test Kubernetes API server, by list and by watch.

Builds N nodes × 8 GPUs (a quarter of them MIG-partitioned through the emulated GPU Operator) and 2 GPU pods
per node, then times through the inventory service (pools/services/inventory.py: its lock,
KubernetesDriver, the rows written), counting queries and writes:
- the first sync, which lists the cluster page by page;
- a no-change re-sync listed whole, as the safety net does every CAPACITY_RELIST_SECONDS;
- an idle re-sync by watch, which catches up from where the last sync stopped and finds nothing;
- a 1 % change applied by watch: 1 % of the nodes stop being Ready (their GPUs' health becomes unknown),
  1 % of the pods end and as many new ones start.
A 100-node fleet is re-synced too, to show that a re-sync's query count does not grow with the fleet.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL;
a throwaway test database is created and dropped):
    .venv/bin/python bench/sync.py [--nodes 1000] [--small 100]
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from copy import deepcopy
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
os.environ.setdefault("DEBUG", "true")

import django  # noqa: E402

django.setup()

import yaml  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases  # noqa: E402
from django.utils import timezone  # noqa: E402
from kubernetes import client, config  # noqa: E402

from pools.models import Cluster  # noqa: E402
from pools.services.inventory import SyncReport, sync_inventory  # noqa: E402
from tests.kube import objects  # noqa: E402
from tests.kube.server import KubeApiServer  # noqa: E402

MIXED = [
    {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.18gb": 7}},
    {"devices": [2], "mig-enabled": True, "mig-devices": {"3g.71gb": 2}},
    {"devices": [3], "mig-enabled": True, "mig-devices": {"4g.71gb": 1, "2g.35gb": 1, "1g.18gb": 1}},
    {"devices": [4, 5, 6, 7], "mig-enabled": False},
]
WRITES = ("INSERT", "UPDATE", "DELETE")


def build_fleet(server: KubeApiServer, nodes: int, kubeconfig: Path) -> list[str]:
    names = server.add_gpu_nodes("gpu", nodes, gpus=8, product="NVIDIA-H200", memory_mib=143771)
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    core = client.CoreV1Api(api_client)
    namespace, name = server.mig_config_map.split("/")
    document = {"version": "v1", "mig-configs": {"bench-mixed": MIXED}}
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=name), data={"config.yaml": yaml.safe_dump(document)}
        ),
    )
    mixed = names[::4]
    for node in mixed:
        core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": "bench-mixed"}}})
    api_client.close()
    deadline = time.monotonic() + 600
    while any(
        server.get("Node", node)["metadata"]["labels"]["nvidia.com/mig.config.state"] != "success"
        for node in mixed
    ):
        if time.monotonic() > deadline:
            raise SystemExit("the emulated MIG manager did not finish")
        time.sleep(0.5)
    with server.lock:  # one lock for the lot: 2 pods per node
        for n in range(nodes * 2):
            server.add_pod(
                f"team-{n % 50}", f"job-{n}", node=names[n % nodes], resources={"nvidia.com/gpu": 1}
            )
    return names


def change_one_percent(server: KubeApiServer, names: list[str]) -> tuple[int, int]:
    """1 % of the nodes stop being Ready, 1 % of the pods end and as many start: (nodes, pods) changed."""
    nodes = names[::100] or names[:1]
    ended = max(1, len(names) * 2 // 100)
    with server.lock:
        for name in nodes:
            node = deepcopy(server.store.get("Node", name))
            node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
            server.store.update(node)
        for n in range(ended):
            pod = deepcopy(server.store.get("Pod", f"job-{n * 50}", f"team-{n * 50 % 50}"))
            pod["status"]["phase"] = "Succeeded"
            server.store.update(pod)
            started = objects.pod(
                "team-new", f"new-{n}", node_name=names[n], resources={"nvidia.com/gpu": 1}, phase="Running",
                labels=None,
            )  # fmt: skip
            if not server.store.has_namespace("team-new"):
                server.store.insert("Namespace", objects.namespace("team-new"))
            server.store.insert("Pod", started)
    return len(nodes), ended


def timed_sync(cluster: Cluster) -> tuple[float, int, int, SyncReport]:
    with CaptureQueriesContext(connection) as ctx:
        started = time.perf_counter()
        report = sync_inventory(cluster=cluster)
        seconds = time.perf_counter() - started
    if report is None:
        raise SystemExit(f"another sync of {cluster.name} holds its lock")
    if not report.ok:
        raise SystemExit(report.error)
    writes = sum(q["sql"].lstrip().upper().startswith(WRITES) for q in ctx.captured_queries)
    return seconds, len(ctx), writes, report


def relist_due(cluster: Cluster) -> None:
    """As if the last full list were a day old: the next sync lists the cluster whole (the safety net)."""
    Cluster.objects.filter(pk=cluster.pk).update(listed_at=timezone.now() - timedelta(days=1))
    cluster.refresh_from_db()


def fleet_figures(nodes: int, workdir: Path, *, change: bool) -> dict[str, tuple]:
    with KubeApiServer(mig_apply_seconds=0.01) as server:
        kubeconfig = server.write_kubeconfig(workdir / f"kubeconfig-{nodes}")
        names = build_fleet(server, nodes, kubeconfig)
        cluster = Cluster(name=f"bench-{nodes}", driver=Cluster.Driver.KUBERNETES)
        cluster.set_kubeconfig(kubeconfig.read_text())
        cluster.save()
        figures: dict[str, tuple] = {"first": timed_sync(cluster)}
        relist_due(cluster)
        figures["relist"] = timed_sync(cluster)
        figures["idle"] = timed_sync(cluster)
        if change:
            figures["changed"] = change_one_percent(server, names)
            figures["change"] = timed_sync(cluster)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--small", type=int, default=100, help="the smaller fleet of the query-count comparison"
    )
    args = parser.parse_args()
    if not 0 < args.small < args.nodes:
        parser.error("--small: at least one node, and fewer than --nodes")
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            large = fleet_figures(args.nodes, Path(tmp), change=True)
            small = fleet_figures(args.small, Path(tmp), change=False)
    finally:
        teardown_databases(databases, verbosity=0)
    gpus = args.nodes * 8
    print(f"fleet: {args.nodes} nodes, {gpus} GPUs, {args.nodes * 2} GPU pods")
    seconds, queries, writes, _report = large["first"]
    print(f"first sync (listed page by page): {seconds:.2f} s, {queries} queries ({writes} writes)")
    seconds, queries, writes, _report = large["relist"]
    print(
        f"no-change re-sync listed whole (safety net): {seconds:.2f} s, {queries} queries ({writes} writes)"
    )
    seconds, queries, writes, report = large["idle"]
    print(f"idle re-sync by watch: {seconds:.2f} s, {queries} queries, {writes} writes")
    nodes, pods = large["changed"]
    seconds, queries, writes, report = large["change"]
    print(
        f"1 % change applied by watch ({nodes} nodes not Ready, {pods} pods ended and {pods} started: "
        f"{report.watched} changes watched): {seconds:.2f} s, {report.rows} rows written in {writes} writes, "
        f"{queries} queries"
    )
    relisted, idle = small["relist"], small["idle"]
    print(
        f"re-sync queries with {args.small} nodes: listed whole {relisted[1]} ({relisted[2]} writes), "
        f"by watch {idle[1]} ({idle[2]} writes)"
    )


if __name__ == "__main__":
    main()
