#!/usr/bin/env python
"""Benchmark: inventory sync of a large fleet from the test Kubernetes API server.

Builds 1,000 nodes × 8 GPUs (a quarter of them MIG-partitioned through the emulated
GPU Operator) and 2,000 GPU pods, then times a first sync and a no-change re-sync
through the inventory service (pools/services/inventory.py: its lock, KubernetesDriver,
the rows written), counting queries and writes. A 100-node fleet is re-synced
too, to show that the re-sync's query count does not grow with the fleet.

Run from the repository root, with the test environment (PostgreSQL per DATABASE_URL;
a throwaway test database is created and dropped):
    .venv/bin/python bench/sync.py [--nodes 1000]
Prints one figure per line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
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
from kubernetes import client, config  # noqa: E402

from pools.models import Cluster  # noqa: E402
from pools.services.inventory import sync_inventory  # noqa: E402
from tests.kube.server import KubeApiServer  # noqa: E402

MIXED = [
    {"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.18gb": 7}},
    {"devices": [2], "mig-enabled": True, "mig-devices": {"3g.71gb": 2}},
    {"devices": [3], "mig-enabled": True, "mig-devices": {"4g.71gb": 1, "2g.35gb": 1, "1g.18gb": 1}},
    {"devices": [4, 5, 6, 7], "mig-enabled": False},
]
WRITES = ("INSERT", "UPDATE", "DELETE")


def build_fleet(server: KubeApiServer, nodes: int, kubeconfig: Path) -> None:
    names = server.add_gpu_nodes("gpu", nodes, gpus=8, product="NVIDIA-H200", memory_mib=143771)
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
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
    deadline = time.monotonic() + 120
    while any(
        server.get("Node", node)["metadata"]["labels"]["nvidia.com/mig.config.state"] != "success"
        for node in mixed
    ):
        if time.monotonic() > deadline:
            raise SystemExit("the emulated MIG manager did not finish")
        time.sleep(0.2)
    for n in range(nodes * 2):
        server.add_pod(f"team-{n % 50}", f"job-{n}", node=names[n % nodes], resources={"nvidia.com/gpu": 1})


def timed_sync(cluster: Cluster) -> tuple[float, int, int, str]:
    with CaptureQueriesContext(connection) as ctx:
        started = time.perf_counter()
        report = sync_inventory(cluster=cluster)
        seconds = time.perf_counter() - started
    if report is None:
        raise SystemExit(f"another sync of {cluster.name} holds its lock")
    if not report.ok:
        raise SystemExit(report.error)
    writes = sum(q["sql"].lstrip().upper().startswith(WRITES) for q in ctx.captured_queries)
    return seconds, len(ctx), writes, report.summary()


def fleet_figures(nodes: int, workdir: Path) -> dict[str, float]:
    with KubeApiServer(mig_apply_seconds=0.01) as server:
        kubeconfig = server.write_kubeconfig(workdir / f"kubeconfig-{nodes}")
        build_fleet(server, nodes, kubeconfig)
        cluster = Cluster(name=f"bench-{nodes}", driver=Cluster.Driver.KUBERNETES)
        cluster.set_kubeconfig(kubeconfig.read_text())
        cluster.save()
        first = timed_sync(cluster)
        again = timed_sync(cluster)
    return {
        "first_seconds": first[0],
        "first_queries": first[1],
        "first_writes": first[2],
        "resync_seconds": again[0],
        "resync_queries": again[1],
        "resync_writes": again[2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument(
        "--small", type=int, default=100, help="the smaller fleet of the query-count comparison"
    )
    args = parser.parse_args()
    databases = setup_databases(verbosity=0, interactive=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            large = fleet_figures(args.nodes, Path(tmp))
            small = fleet_figures(args.small, Path(tmp))
    finally:
        teardown_databases(databases, verbosity=0)
    gpus = args.nodes * 8
    print(f"fleet: {args.nodes} nodes, {gpus} GPUs, {args.nodes * 2} GPU pods")
    print(f"first sync: {large['first_seconds']:.2f} s")
    print(f"first sync queries: {large['first_queries']} ({large['first_writes']} writes)")
    print(f"no-change re-sync: {large['resync_seconds']:.2f} s")
    print(f"no-change re-sync queries: {large['resync_queries']} ({large['resync_writes']} writes)")
    queries, writes = small["resync_queries"], small["resync_writes"]
    print(f"no-change re-sync queries with {args.small} nodes: {queries} ({writes} writes)")


if __name__ == "__main__":
    main()
