"""POST /api/v1/monitoring/samples/: a node agent's batch, let in by an agent token only, taken whole or not
at all (202) and stored by the writer (monitoring.ingest.accepted, run here in the test's process); every bad
body, time or token is a 4xx in JSON with nothing taken, never a 500."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from monitoring.collectors import GpuReading, Reading
from monitoring.collectors.wire import batch_to_json
from monitoring.ingest import accepted
from monitoring.ingest import tokens as agents
from monitoring.models import GpuEvent, Latest, Sample
from monitoring.storage import samples
from portal import tokens
from tests.examples import examples
from tests.factories import ClusterFactory, UserFactory
from tests.monitoring.agent_readings import reading as agent_reading

pytestmark = pytest.mark.django_db

URL = "/api/v1/monitoring/samples/"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def key(node):
    return agents.issue_agent_token(cluster=node.cluster, name=node.name).key


def reading(node, *, at=NOW, **figures) -> Reading:
    return agent_reading(node, at=at, **figures)


def post(client, body, key, *, content_type="application/json", **headers):
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key is not None else {}
    return client.post(URL, data, content_type=content_type, **auth, **headers)


def nothing_stored() -> bool:
    """Nothing taken: none waits for the writer, and none was stored."""
    return (
        not accepted.waiting()
        and not Sample.objects.exists()
        and not Latest.objects.exists()
        and not GpuEvent.objects.exists()
    )


def store() -> accepted.Stored:
    stored = accepted.store()
    assert not stored.dropped and not stored.passed_over, stored
    return stored


def test_a_batch_is_taken_then_stored_as_the_tokens_cluster_and_the_host_noted(client, node, key):
    later = reading(node, at=NOW + timedelta(seconds=15), xid_events=(79,))
    response = post(client, batch_to_json([reading(node), later]), key)

    assert response.status_code == 202, response.content
    assert response.json() == {"samples": 8, "gpus": 4}
    assert accepted.waiting() == 1 and not Sample.objects.exists()
    stored = store()
    assert (stored.batches, stored.samples, stored.events) == (1, 8, 1)
    assert Sample.objects.count() == 8
    assert GpuEvent.objects.get().code == 79
    token = node.cluster.agent_tokens.get()
    assert token.last_host == "gpu-node-1" and token.last_used_at is not None


@pytest.mark.parametrize("stored_between", [False, True])
def test_the_same_batch_twice_is_stored_once(client, node, key, stored_between):
    body = batch_to_json([reading(node)])
    assert post(client, body, key).json()["samples"] == 4
    if stored_between:
        store()
    again = post(client, body, key)

    assert again.status_code == 202 and again.json()["samples"] == 4  # what it carries
    store()
    assert Sample.objects.count() == 4


def _set(path, value):
    """A change to a good batch: the value at `path` (keys and positions) replaced."""

    def change(body):
        target = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        return body

    return change


GPU = ("readings", 0, "gpus", 0)
INSTANCE = ("readings", 0, "gpus", 1, "instances", 0)


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda body: [body], "non_field_errors"),
        (lambda body: {"readings": 5}, "readings"),
        (lambda body: {"readings": []}, "readings"),
        (lambda body: {}, "readings"),
        (_set(("readings", 0, "at"), 12345), "at"),
        (_set(("readings", 0, "at"), "yesterday"), "at"),
        (_set(("readings", 0, "at"), NOW.replace(tzinfo=None).isoformat()), "at"),
        (_set(("readings", 0, "host"), "h" * 254), "host"),
        (_set(("readings", 0, "gpus"), "all of them"), "gpus"),
        (_set((*GPU, "index"), "zero"), "index"),
        (_set((*GPU, "index"), -1), "index"),
        (_set((*GPU, "uuid"), "GPU-" + "x" * 61), "uuid"),
        (_set((*GPU, "power_w"), "hot"), "power_w"),
        (_set((*GPU, "power_w"), -1), "power_w"),
        (_set((*GPU, "utilisation_pct"), 100.5), "utilisation_pct"),
        (_set((*GPU, "temperature_c"), 1000), "temperature_c"),
        (_set((*GPU, "memory_used_bytes"), -5), "memory_used_bytes"),
        (_set((*GPU, "ecc_uncorrected"), 2**70), "ecc_uncorrected"),
        (_set((*GPU, "xid_events"), ["79"] * 2 + ["x"]), "xid_events"),
        (_set((*GPU, "problems"), ["p"] * 51), "problems"),
        (_set((*GPU, "problems"), ["p" * 501]), "problems"),
        (_set((*INSTANCE, "placement"), [0]), "placement"),
        (_set((*INSTANCE, "placement"), [0, 0]), "placement"),
        (_set((*INSTANCE, "placement"), [40000, 4]), "placement"),
        (_set((*INSTANCE, "profile"), "p" * 33), "profile"),
        (_set((*INSTANCE, "sm_active_pct"), -0.1), "sm_active_pct"),
    ],
)
def test_wrong_shapes_types_and_ranges_are_a_400_naming_the_field(client, node, key, change, where):
    body = change(batch_to_json([reading(node)]))
    response = post(client, body, key)

    assert response.status_code == 400
    answer = response.json()
    assert answer["code"] == "invalid" and answer["detail"]
    assert where in json.dumps(answer["errors"])
    assert nothing_stored()


def test_a_number_too_large_for_a_float_is_out_of_range(client, node, key):
    body = json.dumps(batch_to_json([reading(node, sm_active_pct=12.5)])).replace("12.5", "1e999")
    response = post(client, body, key)

    assert response.status_code == 400
    assert "sm_active_pct" in json.dumps(response.json()["errors"])
    assert nothing_stored()


@pytest.mark.parametrize(
    "body",
    ["{not json", '{"readings": [NaN]}', '{"readings": [{"host": "a\\u0000b"}]}', "[" * 5000 + "]" * 5000],
)
def test_a_body_that_is_not_json_we_can_use_is_malformed(client, key, body):
    response = post(client, body, key)

    assert response.status_code == 400
    assert response.json()["code"] == "malformed"
    assert nothing_stored()


@pytest.mark.parametrize(
    ("change", "code", "why"),
    [
        ({"at": NOW - timedelta(days=2)}, "out_of_bounds", "outside the times"),
        ({"at": NOW + timedelta(hours=1)}, "out_of_bounds", "outside the times"),
        ({"host": "elsewhere"}, "refused", "elsewhere is not a node of cluster sim"),
        ({"gpus": (GpuReading(7, "GPU-nobody"),)}, "refused", "has no GPU GPU-nobody"),
    ],
)
def test_a_time_out_of_bounds_or_an_unknown_host_or_gpu_refuses_the_batch(
    client, node, key, change, code, why
):
    good = reading(node)
    response = post(client, batch_to_json([good, replace(good, **change), good]), key)

    assert response.status_code == 400
    answer = response.json()
    assert answer["code"] == code and why in answer["detail"]
    if code == "out_of_bounds":
        assert answer["readings"] == [1]  # the agent drops just that one
    assert nothing_stored()


def test_a_gpu_twice_at_one_instant_refuses_the_batch(client, node, key):
    response = post(client, batch_to_json([reading(node), reading(node)]), key)

    assert response.status_code == 400 and response.json()["code"] == "refused"
    assert nothing_stored()


def test_another_clusters_token_cannot_post_for_this_cluster(client, node):
    other = agents.issue_agent_token(cluster=ClusterFactory(name="other"), name="n").key
    response = post(client, batch_to_json([reading(node)]), other)

    assert response.status_code == 400 and "not a node of cluster other" in response.json()["detail"]
    assert nothing_stored()


def test_a_body_too_large_is_a_413(client, node, key, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = batch_to_json([reading(node, at=NOW + timedelta(seconds=n)) for n in range(3)])
    assert len(json.dumps(body)) > 1000
    response = post(client, body, key)

    assert response.status_code == 413
    assert response.json()["code"] == "too_large" and "1000 bytes" in response.json()["detail"]
    assert nothing_stored()


@pytest.mark.parametrize(
    ("setting", "limit"), [("MONITORING_BATCH_MAX_READINGS", 2), ("MONITORING_BATCH_MAX_GPUS", 5)]
)
def test_more_readings_or_gpus_than_a_batch_holds_is_a_413(client, node, key, settings, setting, limit):
    setattr(settings, setting, limit)
    body = batch_to_json(
        [reading(node, at=NOW + timedelta(seconds=n)) for n in range(3)]
    )  # 3 readings, 6 GPUs
    response = post(client, body, key)

    assert response.status_code == 413
    assert response.json()["code"] == "too_many" and f"at most {limit}" in response.json()["detail"]
    assert nothing_stored()
    setattr(settings, setting, 3 if limit == 2 else 6)
    assert post(client, body, key).status_code == 202


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Bearer a b",
        "Bearer not-a-key",
        "Bearer k\u00e9y",
        "Token {key}",  # an agent's key under the persons' scheme
        "Bearer {revoked}",
        "Bearer {user_key}",  # a person's API token is no agent token
        "Token {user_key}",
    ],
)
def test_a_missing_wrong_or_revoked_token_is_a_401(client, node, key, authorization):
    revoked = agents.issue_agent_token(cluster=node.cluster, name="old")
    agents.revoke_agent_token(token=revoked.token)
    user_key = tokens.issue_token(user=UserFactory(is_staff=True, is_superuser=True)).key
    headers = {}
    if authorization is not None:
        value = authorization.format(key=key, revoked=revoked.key, user_key=user_key)
        headers["HTTP_AUTHORIZATION"] = value.encode().decode("latin-1")
    response = post(client, batch_to_json([reading(node)]), None, **headers)

    assert response.status_code == 401
    assert response.json()["detail"]
    assert response["WWW-Authenticate"] == "Bearer"
    assert nothing_stored()


def test_a_signed_in_superuser_is_no_agent(client, node):
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    response = post(client, batch_to_json([reading(node)]), None)

    assert response.status_code == 401
    assert nothing_stored()


def test_only_post_is_answered(client, key):
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 405 and response.json()["detail"]


def test_the_schema_describes_the_endpoint_and_its_token(client):
    schema = client.get("/api/schema/?format=json").json()
    operation = schema["paths"][URL]["post"]

    assert operation["security"] == [{"agentToken": []}]
    assert set(operation["responses"]) >= {"202", "400", "401", "413", "503"}
    assert "200" not in operation["responses"]
    assert schema["components"]["securitySchemes"]["agentToken"]["scheme"] == "bearer"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
FIELDS = [
    ("readings",),
    ("readings", 0),
    ("readings", 0, "host"),
    ("readings", 0, "at"),
    ("readings", 0, "gpus"),
    (*GPU,),
    (*GPU, "uuid"),
    (*GPU, "index"),
    (*GPU, "power_w"),
    (*GPU, "xid_events"),
    (*GPU, "instances"),
    (*INSTANCE, "placement"),
    (*INSTANCE, "gpu_instance_id"),
]
FUZZ = settings(
    max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(path=st.sampled_from(FIELDS), value=json_values)
def test_whatever_a_field_holds_the_answer_is_never_a_500(client, node, key, path, value):
    body = _set(path, value)(batch_to_json([reading(node)]))
    before = Sample.objects.count(), Latest.objects.count()
    response = post(client, body, key)

    assert response.status_code in {202, 400, 413}, response.content
    assert response.json()
    if response.status_code == 202:
        store()  # what is taken is stored, with nothing dropped or passed over
    else:
        assert not accepted.waiting()
        assert (Sample.objects.count(), Latest.objects.count()) == before


DEEP = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]


@pytest.mark.parametrize(
    "change",
    [
        lambda body: {**body, "note": DEEP},  # deep under a key the batch does not name
        lambda body: _set((*GPU, "power_w"), DEEP)(body),  # deep where a figure belongs
        lambda body: {**body, "note": "a\u0000b"},  # a NUL where nothing else is read
    ],
)
def test_a_document_the_parser_refuses_is_malformed_wherever_the_fault_hides(client, node, key, change):
    response = post(client, change(batch_to_json([reading(node)])), key)

    assert response.status_code == 400 and response.json()["code"] == "malformed"
    assert nothing_stored()


def test_a_document_both_too_deep_and_too_many_is_malformed_first(client, node, key, settings):
    settings.MONITORING_BATCH_MAX_READINGS = 1
    body = batch_to_json([reading(node), reading(node, at=NOW + timedelta(seconds=15))])
    body["note"] = DEEP
    response = post(client, body, key)

    assert response.status_code == 400 and response.json()["code"] == "malformed"


def test_keys_the_batch_does_not_name_are_passed_over(client, node, key):
    body = batch_to_json([reading(node)])
    body["readings"][0]["gpus"][0]["driver"] = {"version": "550.54"}
    response = post(client, body, key)

    assert response.status_code == 202 and response.json()["samples"] == 4
    assert store().samples == 4


@pytest.mark.parametrize(
    ("content_type", "accept", "status"),
    [
        ("application/json; charset=utf-8", "*/*", 202),
        ("application/json; charset=latin-1", "application/json", 202),  # through the framework's dispatch
        ("text/plain", "application/json", 415),
        ("application/json", "text/html", 406),
    ],
)
def test_media_types_are_answered_as_the_framework_answers_them(
    client, node, key, content_type, accept, status
):
    response = post(
        client, batch_to_json([reading(node)]), key, content_type=content_type, HTTP_ACCEPT=accept
    )

    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json" and response["Allow"] == "POST, OPTIONS"
    store()
    assert (Sample.objects.count() == 4) == (status == 202)


def test_answers_carry_the_frameworks_headers(client, node, key):
    stored = post(client, batch_to_json([reading(node)]), key)
    refused = post(client, {"readings": 5}, key)
    unknown = post(client, batch_to_json([reading(node)]), "not-a-key")

    for response in (stored, refused, unknown):
        assert response["Content-Type"] == "application/json" and response["Allow"] == "POST, OPTIONS"
    assert stored.content == b'{"samples":4,"gpus":2}'  # compact, as the framework renders
    assert unknown.status_code == 401 and unknown["WWW-Authenticate"] == "Bearer"


def test_a_batch_partly_stored_before_is_stored_for_the_rest(client, node, key):
    """A resend that races the first (its samples there, its newest figures not yet) and samples written by
    another path both come to this: the new samples are stored, the others passed over."""
    full = node.gpus.get(index=0)
    samples.store([samples.Row(full.pk, -1, NOW, power_w=1.0)])
    response = post(client, batch_to_json([reading(node)]), key)

    assert response.status_code == 202 and store().samples == 3
    assert Sample.objects.get(gpu=full, slot=-1).power_w == 1.0
    assert Latest.objects.count() == 4


def test_an_instance_reported_twice_is_stored_once(client, node, key):
    body = batch_to_json([reading(node)])
    instances = body["readings"][0]["gpus"][1]["instances"]
    instances.append(dict(instances[0]))
    response = post(client, body, key)

    assert response.status_code == 202 and response.json()["samples"] == 4
    assert store().samples == 4
    assert Sample.objects.count() == 4


def test_the_writer_notes_the_tokens_use_with_the_batch(client, node, key):
    token = node.cluster.agent_tokens.get()
    assert post(client, batch_to_json([reading(node)]), key).status_code == 202
    token.refresh_from_db()
    assert token.last_used_at is None  # taken, not yet stored
    store()
    token.refresh_from_db()
    assert token.last_host == "gpu-node-1" and token.last_used_at is not None

    # Within the minute, the next batch writes nothing of the token.
    first = token.last_used_at
    post(client, batch_to_json([reading(node, at=NOW + timedelta(seconds=15))]), key)
    store()
    token.refresh_from_db()
    assert token.last_used_at == first


def test_a_refused_batch_notes_its_tokens_use_too(client, node, key):
    assert post(client, {"readings": 5}, key).status_code == 400

    assert node.cluster.agent_tokens.get().last_used_at is not None


def test_a_batch_costs_as_many_queries_whatever_it_holds(
    client, node, key, django_assert_max_num_queries, settings
):
    """One node's reading or a buffer of many: the same statements as it is taken (the token, the hosts'
    GPUs, each read again here: no copy kept), never one per GPU or reading."""
    settings.MONITORING_AGENT_COPY_SECONDS = 0
    now = datetime.now(UTC).replace(microsecond=0)  # fresh readings, as an agent posts them
    one = batch_to_json([reading(node, at=now)])
    buffered = batch_to_json([reading(node, at=now + timedelta(seconds=15 * n)) for n in range(1, 9)])
    with django_assert_max_num_queries(2) as small:
        assert post(client, one, key).json()["samples"] == 4
    with django_assert_max_num_queries(2) as large:
        assert post(client, buffered, key).json()["samples"] == 32
    assert len(large.captured_queries) == len(small.captured_queries)
