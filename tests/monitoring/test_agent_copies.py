"""A web process's copies of agents' tokens and hosts (monitoring.ingest.copies): an agent's next batch costs
the endpoint no query; a revocation still stops the token at once in every process, and the writer stores
nothing a token brought once revoked; a batch is refused only on a fresh read of its hosts."""

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext
from msgspec.structs import replace

from monitoring.collectors import GpuReading
from monitoring.collectors.wire import batch_to_json
from monitoring.ingest import accepted, broker, copies, hosts
from monitoring.ingest import tokens as agents
from monitoring.models import Sample
from portal.tokens import digest
from tests.factories import ClusterFactory, GpuCapacityFactory, NodeCapacityFactory
from tests.monitoring.agent_readings import reading

pytestmark = pytest.mark.django_db

URL = "/api/v1/monitoring/samples/"


@pytest.fixture
def issued(node):
    return agents.issue_agent_token(cluster=node.cluster, name=node.name)


def post(client, key, *readings):
    body = json.dumps(batch_to_json(readings))
    return client.post(URL, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def now(seconds: int = 0) -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds)


def revoke_elsewhere(issued) -> None:
    """Revoke the token as another process would: this one keeps its copy."""
    held = copies.get(agents._COPIES, digest(issued.key))
    assert held is not None
    agents.revoke_agent_token(token=issued.token)
    copies.keep(agents._COPIES, digest(issued.key), held)


def test_an_agents_next_batch_costs_the_endpoint_no_query(client, node, issued, django_assert_num_queries):
    assert post(client, issued.key, reading(node, at=now())).status_code == 202
    later = reading(node, at=now(15))

    with django_assert_num_queries(0):
        answer = post(client, issued.key, later)
    assert (answer.status_code, answer.json()) == (202, {"samples": 4, "gpus": 2})
    assert accepted.store().samples == 8


def test_the_first_token_read_reads_every_live_one_so_other_agents_first_batches_read_none(
    client, node, issued, django_capture_on_commit_callbacks
):
    """A web process starts with no copies, and every agent of a fleet posts within 15 s."""
    other = agents.issue_agent_token(cluster=node.cluster, name="another agent")
    gone = agents.issue_agent_token(cluster=node.cluster, name="a revoked agent")
    with django_capture_on_commit_callbacks(execute=True):
        agents.revoke_agent_token(token=gone.token)
    readings = [reading(node, at=now(seconds)) for seconds in (0, 15, 30)]
    with CaptureQueriesContext(connection) as first:
        assert post(client, issued.key, readings[0]).status_code == 202
    assert sum("monitoring_agenttoken" in query["sql"] for query in first.captured_queries) == 1

    with CaptureQueriesContext(connection) as queries:
        assert post(client, other.key, readings[1]).status_code == 202
    assert not [query for query in queries.captured_queries if "monitoring_agenttoken" in query["sql"]]
    assert copies.get(agents._COPIES, digest(gone.key)) is None  # a revoked token is not copied

    with CaptureQueriesContext(connection) as queries:  # read alone, and found revoked
        assert post(client, gone.key, readings[2]).status_code == 401
    assert len(queries.captured_queries) == 1
    assert accepted.store().samples == 8


def node_like(node, name: str):
    """Another node of `node`'s kind (its readings made alike), in `node`'s cluster."""
    other = NodeCapacityFactory(cluster=node.cluster, name=name, gpu_model=node.gpu_model)
    GpuCapacityFactory(node=other, index=0)
    GpuCapacityFactory(node=other, index=1, mig={"3g.40gb": 2})
    return other


def host_reads(queries) -> int:
    return sum("pools_nodecapacity" in query["sql"] for query in queries.captured_queries)


def test_the_first_host_read_reads_every_host_of_its_cluster_so_other_agents_first_batches_read_none(
    client, node, issued
):
    """A web process starts with no copies, and every agent of a fleet posts within 15 s."""
    second = node_like(node, "gpu-node-2")
    other = agents.issue_agent_token(cluster=node.cluster, name=second.name)
    elsewhere = NodeCapacityFactory(cluster=ClusterFactory(name="other"), name="gpu-node-2")
    with CaptureQueriesContext(connection) as first:
        assert post(client, issued.key, reading(node, at=now())).status_code == 202
    assert host_reads(first) == 1
    assert copies.get(hosts._COPIES, (elsewhere.cluster_id, elsewhere.name)) is None  # its cluster's alone

    with CaptureQueriesContext(connection) as queries:
        assert post(client, other.key, reading(second, at=now())).status_code == 202
    assert host_reads(queries) == 0

    third = node_like(node, "gpu-node-3")  # the inventory sync found a node since: read on its own
    with CaptureQueriesContext(connection) as queries:
        answer = post(client, other.key, reading(third, at=now()))
    assert (answer.status_code, answer.json(), host_reads(queries)) == (202, {"samples": 4, "gpus": 2}, 1)
    assert accepted.store().samples == 12


def test_a_clusters_hosts_are_read_a_page_at_a_time(client, node, issued, monkeypatch):
    monkeypatch.setattr(hosts, "_CLUSTER_PAGE", 1)
    second = node_like(node, "gpu-node-2")
    other = agents.issue_agent_token(cluster=node.cluster, name=second.name)
    with CaptureQueriesContext(connection) as first:
        assert post(client, other.key, reading(second, at=now())).status_code == 202
    assert host_reads(first) == 3  # a node, the other, none left

    with CaptureQueriesContext(connection) as queries:
        assert post(client, issued.key, reading(node, at=now())).status_code == 202
    assert host_reads(queries) == 0
    assert accepted.store().samples == 8


def test_without_copies_each_batch_reads_the_token_and_its_hosts(client, node, issued, settings):
    settings.MONITORING_AGENT_COPY_SECONDS = 0
    assert post(client, issued.key, reading(node, at=now())).status_code == 202
    later = reading(node, at=now(15))

    with CaptureQueriesContext(connection) as queries:
        assert post(client, issued.key, later).status_code == 202
    tables = " ".join(query["sql"] for query in queries.captured_queries)
    assert len(queries.captured_queries) == 2
    assert "monitoring_agenttoken" in tables and "pools_nodecapacity" in tables


def test_a_revocation_elsewhere_stops_this_processs_copy_at_once(
    client, node, issued, django_capture_on_commit_callbacks, django_assert_num_queries
):
    assert post(client, issued.key, reading(node, at=now())).status_code == 202
    with django_capture_on_commit_callbacks(execute=True):
        revoke_elsewhere(issued)

    refused = post(client, issued.key, reading(node, at=now(15)))
    assert refused.status_code == 401
    assert refused.json()["detail"] == "This agent token is not valid or was revoked."
    assert refused["WWW-Authenticate"] == "Bearer"
    assert accepted.waiting() == 1  # the batch taken before the revocation only
    assert accepted.store().samples == 4
    last = reading(node, at=now(30))
    with django_assert_num_queries(1):  # the copy is dropped: the token is read, and found revoked
        assert post(client, issued.key, last).status_code == 401


def test_the_writer_stores_nothing_a_token_brought_once_revoked_though_the_broker_never_heard(
    client, node, issued
):
    first = now()
    assert post(client, issued.key, reading(node, at=first)).status_code == 202
    revoke_elsewhere(issued)  # its commit, which tells the broker, never comes here
    assert post(client, issued.key, reading(node, at=now(15))).status_code == 202  # the copy took it

    stored = accepted.store()
    assert (stored.batches, stored.samples, stored.dropped) == (1, 4, 1)
    assert Sample.objects.filter(at=first).count() == 4 and Sample.objects.count() == 4


def test_a_broker_that_does_not_hear_of_a_revocation_leaves_it_made_and_logged(
    node, issued, monkeypatch, caplog, django_capture_on_commit_callbacks
):
    def down(*args, **kwargs):
        raise redis.ConnectionError("no broker")

    monkeypatch.setattr(broker.client(), "zadd", down)
    with caplog.at_level(logging.ERROR), django_capture_on_commit_callbacks(execute=True):
        revoked = agents.revoke_agent_token(token=issued.token)

    assert revoked.revoked_at is not None
    assert revoked.__class__.objects.get().revoked_at == revoked.revoked_at
    assert f"Could not tell the broker that agent token {revoked.pk} was revoked" in caplog.text
    assert agents.find_agent_token(issued.key) is None


def test_revocations_are_kept_as_long_as_a_copy_may_live_and_no_longer(
    node, issued, settings, django_capture_on_commit_callbacks
):
    settings.MONITORING_AGENT_COPY_SECONDS = 600
    old = agents.issue_agent_token(cluster=node.cluster, name="gone")
    key = broker.revoked_tokens_key()
    broker.client().zadd(key, {str(old.token.pk): (now() - timedelta(seconds=600 + 61)).timestamp()})
    with django_capture_on_commit_callbacks(execute=True):
        agents.revoke_agent_token(token=issued.token)

    assert broker.client().zrange(key, 0, -1) == [str(issued.token.pk).encode()]


def test_a_gpu_a_copy_does_not_know_is_taken_on_a_fresh_read(client, node, issued):
    assert post(client, issued.key, reading(node, at=now())).status_code == 202
    later = reading(node, at=now(15))
    added = GpuCapacityFactory(node=node, index=2)  # the inventory sync found a third GPU
    third = GpuReading(2, added.uuid, "NVIDIA H100 80GB HBM3", False, power_w=310.0)

    answer = post(client, issued.key, replace(later, gpus=(*later.gpus, third)))
    assert (answer.status_code, answer.json()) == (202, {"samples": 5, "gpus": 3})


def test_a_gpu_the_portal_does_not_know_is_refused_on_a_fresh_read(
    client, node, issued, django_assert_num_queries
):
    assert post(client, issued.key, reading(node, at=now())).status_code == 202
    stranger = GpuReading(2, "GPU-not-in-the-inventory", "NVIDIA H100 80GB HBM3", False, power_w=310.0)
    later = reading(node, at=now(15))

    with django_assert_num_queries(2):  # the hosts read again before refusing, the token's first use noted
        refused = post(client, issued.key, replace(later, gpus=(*later.gpus, stranger)))
    assert refused.status_code == 400 and refused.json()["code"] == "refused"
    assert "has no GPU GPU-not-in-the-inventory" in refused.json()["detail"]
    assert accepted.waiting() == 1
