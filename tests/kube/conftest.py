"""Fixtures of the Kubernetes tests: the test API server, and the official client connected to it as the
admin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client import CoreV1Api
from kubernetes.config import new_client_from_config

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


@pytest.fixture
def admin(kube: KubeApiServer, tmp_path: Path) -> Iterator[client.ApiClient]:
    api_client = new_client_from_config(config_file=str(kube.write_kubeconfig(tmp_path / "admin")))
    yield api_client
    api_client.close()


@pytest.fixture
def policies(admin: client.ApiClient) -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(admin)
