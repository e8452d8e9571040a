"""Fixtures of the Kubernetes tests: the test API server, and the official client connected to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.client import CoreV1Api

from tests.kube.client import connect
from tests.kube.server import KubeApiServer


@pytest.fixture
def kube() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server


@pytest.fixture
def core(kube: KubeApiServer, tmp_path: Path) -> Iterator[CoreV1Api]:
    api = connect(kube, tmp_path)
    yield api
    api.api_client.close()
