"""Agents' batches between the answer and storage (monitoring.ingest.accepted): many agents' batches are
stored in one transaction; a full list refuses more; a failing database puts the batches back in order; a
batch that cannot be stored costs only itself; what went since a batch was taken is passed over; the writer
is sent for once; a real worker stores what the endpoint took."""

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext

from monitoring import metrics, task_names
from monitoring.collectors.wire import batch_to_json
from monitoring.ingest import accepted
from monitoring.ingest import tokens as agents
from monitoring.models import Sample
from tests.factories import ClusterFactory, GpuCapacityFactory, NodeCapacityFactory
from tests.monitoring.agent_readings import reading

URL = "/api/v1/monitoring/samples/"
NOW = datetime.now(UTC).replace(microsecond=0)


def make_node(cluster, name):
    node = NodeCapacityFactory(cluster=cluster, name=name, gpu_model="H100-80GB")
    GpuCapacityFactory(node=node, index=0)
    GpuCapacityFactory(node=node, index=1, mig={"3g.40gb": 2})
    return node, agents.issue_agent_token(cluster=cluster, name=name).key


@pytest.fixture
def fleet(db):
    cluster = ClusterFactory(name="sim")
    return [make_node(cluster, f"gpu-node-{n}") for n in (1, 2)]


def post(client, node, key, *instants):
    body = json.dumps(batch_to_json([reading(node, at=at) for at in instants or (NOW,)]))
    return client.post(URL, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def waiting_entries() -> list[bytes]:
    return accepted._client().lrange(accepted._key(), 0, -1)


def test_many_agents_batches_are_stored_in_one_transaction_of_as_many_statements_as_one(client, fleet):
    (first, first_key), _second = fleet
    assert post(client, first, first_key).status_code == 202
    with CaptureQueriesContext(connection) as one:
        assert accepted.store().batches == 1

    later = (NOW + timedelta(seconds=15), NOW + timedelta(seconds=30))
    for node, key in fleet:
        for at in later:
            assert post(client, node, key, at).status_code == 202
    with CaptureQueriesContext(connection) as many:
        stored = accepted.store()

    assert (stored.batches, stored.samples, stored.dropped) == (4, 16, 0)
    assert len(many.captured_queries) == len(one.captured_queries)
    assert sum("COPY" in query["sql"] for query in many.captured_queries) == 1
    assert Sample.objects.count() == 20 and not accepted.waiting()
    assert {token.last_host for token in first.cluster.agent_tokens.all()} == {"gpu-node-1", "gpu-node-2"}


def test_a_full_list_is_a_503_and_takes_nothing_more(client, fleet, settings):
    settings.MONITORING_ACCEPTED_MAX_BATCHES = 1
    (first, first_key), (second, second_key) = fleet
    assert post(client, first, first_key).status_code == 202
    refused = post(client, second, second_key)

    assert refused.status_code == 503 and refused.json()["code"] == "busy"
    assert "Send them again later" in refused.json()["detail"]
    assert accepted.waiting() == 1
    accepted.store()
    assert post(client, second, second_key).status_code == 202


def test_the_writer_is_sent_for_by_a_batch_that_finds_it_idle_only(client, fleet, monkeypatch):
    sent = []
    monkeypatch.setattr(accepted.app, "send_task", lambda name, *args, **kwargs: sent.append(name))
    (first, first_key), (second, second_key) = fleet
    post(client, first, first_key)
    post(client, second, second_key)
    assert sent == [task_names.STORE_ACCEPTED]  # the second found a batch waiting: the writer is sent for

    accepted.store()
    lock = accepted._client().lock(accepted._writer(accepted._key()), timeout=10)
    assert lock.acquire(blocking=False)
    post(client, first, first_key, NOW + timedelta(seconds=15))
    assert len(sent) == 1  # a writer at work looks at the list again before it stops
    lock.release()
    post(client, second, second_key, NOW + timedelta(seconds=15))
    assert len(sent) == 1  # a batch waits still: the next writer takes both
    assert accepted.store().batches == 2


def test_a_writer_finding_another_at_work_leaves_the_list_to_it(client, fleet):
    (first, first_key), _second = fleet
    post(client, first, first_key)
    lock = accepted._client().lock(accepted._writer(accepted._key()), timeout=10)
    assert lock.acquire(blocking=False)
    try:
        assert accepted.store().batches == 0 and accepted.waiting() == 1
        assert not accepted.idle()
    finally:
        lock.release()
    assert accepted.store().batches == 1 and accepted.idle()


def test_a_failing_database_puts_the_batches_back_in_their_order(client, fleet, monkeypatch):
    (first, first_key), (second, second_key) = fleet
    post(client, first, first_key)
    post(client, second, second_key)
    post(client, first, first_key, NOW + timedelta(seconds=15))
    entries = waiting_entries()

    def database_down(**kwargs):
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr(accepted, "ingest", database_down)
    with pytest.raises(OperationalError):
        accepted.store()
    assert waiting_entries() == entries and not Sample.objects.exists()

    monkeypatch.undo()
    assert accepted.store().batches == 3 and Sample.objects.count() == 12


def test_a_batch_that_cannot_be_stored_costs_only_itself(client, fleet, monkeypatch, caplog):
    (first, first_key), (second, second_key) = fleet
    post(client, first, first_key)
    post(client, second, second_key)
    ingest = accepted.ingest

    def fails_for_the_second(**kwargs):
        if any(reading.host == second.name for reading in kwargs["readings"]):
            raise ValueError("a fault of this batch alone")
        return ingest(**kwargs)

    monkeypatch.setattr(accepted, "ingest", fails_for_the_second)
    stored = accepted.store()

    assert (stored.batches, stored.dropped) == (1, 1)
    assert set(Sample.objects.values_list("gpu__node__name", flat=True)) == {first.name}
    assert "Dropped an accepted batch of sim that cannot be stored" in caplog.text
    assert not accepted.waiting()


def test_what_went_since_a_batch_was_taken_is_passed_over(client, fleet):
    (first, first_key), (second, second_key) = fleet
    post(client, first, first_key)
    post(client, second, second_key)
    second.present = False  # the inventory sync found the node gone
    second.save(update_fields=["present"])
    stored = accepted.store()

    assert (stored.batches, stored.samples, stored.dropped) == (2, 4, 0)
    assert stored.passed_over == ["gpu-node-2 is not a node of cluster sim."]


def test_a_cluster_deleted_since_drops_its_batches(client, fleet):
    (first, first_key), _second = fleet
    post(client, first, first_key)
    first.cluster.delete()

    stored = accepted.store()
    assert (stored.batches, stored.dropped) == (0, 1) and not accepted.waiting()


def test_an_entry_that_cannot_be_read_is_dropped_and_the_rest_stored(client, fleet):
    (first, first_key), _second = fleet
    accepted._client().rpush(accepted._key(), b"not an entry")
    post(client, first, first_key)

    stored = accepted.store()
    assert (stored.batches, stored.samples, stored.dropped) == (1, 4, 1)


def test_an_entry_left_by_the_wires_own_functions_is_read_alike(client, fleet):
    """What an earlier release left waiting (the readings written by monitoring.collectors.wire, times with
    +00:00) is stored as the entries written now are."""
    (node, key), _second = fleet
    token = node.cluster.agent_tokens.get(name=node.name)
    body = json.dumps(batch_to_json([reading(node, at=NOW)]))
    accepted._client().rpush(accepted._key(), f"{node.cluster_id} {token.pk} {NOW.timestamp()!r}\n{body}")
    post(client, node, key, NOW + timedelta(seconds=15))

    stored = accepted.store()
    assert (stored.batches, stored.samples, stored.dropped) == (2, 8, 0)
    instants = sorted(Sample.objects.values_list("at", flat=True).distinct())
    assert instants == [NOW, NOW + timedelta(seconds=15)]


def test_readings_are_stored_with_the_times_of_their_taking(fleet, settings):
    """A reading the portal took a minute before its oldest bound is stored however late the writer comes."""
    settings.MONITORING_SAMPLE_MAX_AGE_SECONDS = 60
    (node, _key), _second = fleet
    taken = NOW - timedelta(hours=1)
    token = node.cluster.agent_tokens.get(name=node.name)
    readings = [reading(node, at=taken - timedelta(seconds=30))]
    accepted.put(cluster_id=node.cluster_id, token_id=token.pk, at=taken, readings=readings)

    stored = accepted.store()
    assert (stored.samples, stored.passed_over) == (4, [])


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_the_worker_stores_what_the_endpoint_took(celery_worker, client):
    node, key = make_node(ClusterFactory(name="sim"), "gpu-node-1")
    at = datetime.now(UTC).replace(microsecond=0)
    assert post(client, node, key, at).status_code == 202

    deadline = time.monotonic() + 30
    while Sample.objects.count() < 4:
        assert time.monotonic() < deadline, celery_worker.log.read_text()[-3000:]
        time.sleep(0.1)
    assert not accepted.waiting()


def test_metrics_say_how_many_batches_wait_and_leave_it_out_without_redis(client, fleet, monkeypatch):
    for node, key in fleet:
        post(client, node, key)
    name = "gpu_portal_monitoring_batches_waiting"

    [family] = [family for family in metrics.collect() if family.name == name]
    assert [sample.value for sample in family.samples] == [2]

    def no_answer():
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(accepted, "waiting", no_answer)
    assert name not in {family.name for family in metrics.collect()}


def test_a_queue_that_does_not_answer_is_a_503_and_takes_nothing(client, fleet, monkeypatch, caplog):
    (node, key), _second = fleet

    class Gone:
        def __call__(self, *args, **kwargs):
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(accepted, "_put_script", lambda: Gone())
    response = post(client, node, key)

    assert response.status_code == 503 and response.json()["code"] == "unavailable"
    assert "Send them again later" in response.json()["detail"]
    assert "Could not leave an agent's batch for the writer" in caplog.text
    monkeypatch.undo()
    assert not accepted.waiting() and not Sample.objects.exists()


def test_a_run_that_used_its_time_sends_for_the_writer_again_behind_the_queues_other_tasks(
    client, fleet, monkeypatch
):
    sent = []
    monkeypatch.setattr(accepted.app, "send_task", lambda name, *args, **kwargs: sent.append(name))
    for node, key in fleet:
        post(client, node, key)
    sent.clear()

    used_up = accepted.store(within=0)
    assert used_up.batches == 0 and accepted.waiting() == 2  # no round begins once the time is up
    assert sent == [task_names.STORE_ACCEPTED]
    assert accepted.store(most=1, within=60).batches == 2 and not accepted.waiting()
    assert sent == [task_names.STORE_ACCEPTED]  # done within its time: nothing more to send for


def test_a_lingering_writer_lets_batches_gather_between_rounds_unless_a_full_round_waits(
    client, fleet, monkeypatch
):
    (first, first_key), (second, second_key) = fleet
    rounds, pauses = [], []
    store_round = accepted._store

    def counted(entries, stored, **kwargs):
        rounds.append(len(entries))
        store_round(entries, stored, **kwargs)

    def pause(*, until):
        pauses.append(until - time.monotonic())
        if len(pauses) == 1:  # two agents post while the writer waits
            for node, key in ((first, first_key), (second, second_key)):
                assert post(client, node, key, NOW + timedelta(seconds=15)).status_code == 202

    monkeypatch.setattr(accepted, "_store", counted)
    monkeypatch.setattr(accepted, "_pause", pause)
    post(client, first, first_key)
    stored = accepted.store(linger=0.01, gather=5)
    assert rounds == [1, 2] and stored.batches == 3 and not accepted.waiting()
    assert len(pauses) == 2 and 4 < pauses[0] <= 5  # until 5 s after the round began

    rounds.clear()
    pauses.clear()
    for node, key in fleet:
        post(client, node, key, NOW + timedelta(seconds=30))
    assert accepted.store(most=1, linger=0.01, gather=5).batches == 2
    assert rounds == [1, 1] and pauses == []  # a full round waited each time: no pause

    post(client, first, first_key, NOW + timedelta(seconds=45))
    assert accepted.store(gather=5).batches == 1 and pauses == []  # a run that stores what waits now
