"""Fixtures of the capacity tests: simulated clusters with small fleets."""

import pytest

from pools.sync import sync_cluster
from tests.factories import ClusterFactory

FULL = [None] * 8
SMALL_FLEET = [
    ("h200", 2, "H200-141GB", [{"1g.18gb": 7}, {"3g.71gb": 2}, None, None, None, None, None, None]),
    ("h100", 1, "H100-80GB", FULL),
]


@pytest.fixture(autouse=True)
def _instant_mig(settings):
    settings.SIMULATED_MIG_APPLY_SECONDS = 0


@pytest.fixture
def sim_cluster(db):
    return ClusterFactory(name="sim", fleet=SMALL_FLEET)


@pytest.fixture
def fleet(sim_cluster):
    """The small fleet synced: h200-1, h200-2 (GPU 0 = 7 × 1g.18gb, GPU 1 = 2 × 3g.71gb, 6 whole GPUs each),
    h100-1 (8 whole GPUs)."""
    sync_cluster(cluster=sim_cluster)
    return sim_cluster
