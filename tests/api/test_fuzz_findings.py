"""What the schema fuzzer found, each kept fixed by a focused test: the answers that were 500s, and the
schema's account of the API where it did not match what the API answers."""

import json
import re

import pytest

from pools.models import PoolRequest
from portal.middleware import MAX_QUERY_VALUE_LENGTH
from tests.api.openapi import served_schema
from tests.factories import GpuGroupFactory


@pytest.fixture(scope="module")
def schema() -> dict:
    return served_schema()


def test_the_fuzzed_schema_is_the_served_one(db, api_client):
    """The fuzzer (test_schema_fuzz.py) reads the schema before any database exists: it is the one served."""
    response = api_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert json.loads(response.content) == served_schema()


@pytest.mark.parametrize("month", ["0000-01", "0001-01", "9999-12", "1999-12", "3000-01"])
def test_a_month_outside_the_billing_years_is_a_400_not_a_500(month, tenancy, api_for):
    response = api_for(tenancy.acme_member).get(f"/api/v1/usage/?month={month}")
    assert response.status_code == 400, response.content
    assert "YYYY-MM" in response.json()["month"][0]


def test_requests_and_pools_each_have_their_own_states(schema):
    components = schema["components"]["schemas"]
    request_state = components["PoolRequest"]["properties"]["state"]["$ref"].rsplit("/", 1)[1]
    pool_state = components["Pool"]["properties"]["state"]["$ref"].rsplit("/", 1)[1]
    assert "fulfilled" in components[request_state]["enum"]
    assert "fulfilled" not in components[pool_state]["enum"]


def test_paging_parameters_carry_the_bounds_the_api_enforces(schema):
    parameters = {p["name"]: p["schema"] for p in schema["paths"]["/api/v1/pools/"]["get"]["parameters"]}
    assert (parameters["limit"]["minimum"], parameters["limit"]["maximum"]) == (1, 500)
    assert parameters["offset"]["minimum"] == 0


def test_an_invoice_month_is_documented_as_it_is_written(schema):
    month = schema["components"]["schemas"]["Invoice"]["properties"]["month"]
    assert "format" not in month and month["pattern"] == r"^\d{4}-(0[1-9]|1[0-2])$"


def test_every_operation_documents_its_refusals_as_json(schema):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            if "{" in path:
                assert "404" in responses, (method, path)
            if operation.get("security") != [{}]:
                assert "401" in responses, (method, path)
            for code, response in responses.items():
                if code.startswith("4"):
                    assert list(response["content"]) == ["application/json"], (method, path, code)


def test_bodies_are_documented_as_json_only(schema):
    create = schema["paths"]["/api/v1/pool-requests/"]["post"]["requestBody"]
    assert list(create["content"]) == ["application/json"]


def _request_strings(schema: dict):
    """(where, schema) of every string a request carries: parameters and bodies, through their components."""
    components = schema["components"]["schemas"]

    def walk(node, where, seen):
        if not isinstance(node, dict):
            return
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[1]
            if name not in seen:
                yield from walk(components[name], name, seen | {name})
            return
        if node.get("type") == "string":
            yield where, node
        for key, child in node.get("properties", {}).items():
            yield from walk(child, f"{where}.{key}", seen)
        for child in [
            node.get("items"),
            *node.get("oneOf", []),
            *node.get("allOf", []),
            *node.get("anyOf", []),
        ]:
            yield from walk(child, where, seen)

    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                yield from walk(parameter["schema"], f"{method} {path} {parameter['name']}", frozenset())
            for content in operation.get("requestBody", {}).get("content", {}).values():
                yield from walk(content["schema"], f"{method} {path} body", frozenset())


def test_no_string_a_request_carries_may_hold_nul_and_the_schema_says_so(schema):
    found = list(_request_strings(schema))
    assert len(found) > 20
    for where, string in found:
        if "enum" in string or "format" in string:
            continue
        assert "pattern" in string, where
        pattern = re.compile(string["pattern"])  # ECMA's \u0000 reads the same in Python
        assert pattern.search("a\x00b") is None, where


def test_a_query_value_is_documented_as_long_as_the_portal_takes_it(schema):
    for path, operations in schema["paths"].items():
        for parameter in operations.get("get", {}).get("parameters", []):
            if parameter["in"] == "query" and parameter["schema"]["type"] == "string":
                assert parameter["schema"]["maxLength"] <= MAX_QUERY_VALUE_LENGTH, (path, parameter["name"])


def test_a_pool_request_has_one_to_twenty_items_in_the_schema_and_at_the_server(
    schema, synced, tenancy, api_for
):
    items = schema["components"]["schemas"]["PoolRequestCreateRequest"]["properties"]["items"]
    assert (items["minItems"], items["maxItems"]) == (1, 20)
    synced([("h100", 1, "H100-80GB", [None] * 8)])
    client = api_for(tenancy.acme_member)
    for many in ([], [{"spec": "h100-80gb.full", "count": 1}] * 21):
        answer = client.post(
            "/api/v1/pool-requests/", {"project": tenancy.vision.pk, "items": many}, format="json"
        )
        assert answer.status_code == 400 and "items" in answer.json(), answer.content
    assert not PoolRequest.objects.exists()


def test_a_purpose_is_a_group_the_clusters_endpoint_lists(schema, synced, tenancy, api_for):
    purpose = schema["components"]["schemas"]["PoolRequestCreateRequest"]["properties"]["purpose"]
    assert "/api/v1/clusters/" in purpose["description"]
    specs = {p["name"]: p for p in schema["paths"]["/api/v1/specs/"]["get"]["parameters"]}
    assert re.fullmatch(specs["purpose"]["schema"]["pattern"], "") is not None
    assert re.fullmatch(specs["purpose"]["schema"]["pattern"], "Not A Group") is None
    cluster = synced([("h100", 2, "H100-80GB", [None] * 8)])
    training = GpuGroupFactory(cluster=cluster, name="training")
    cluster.nodes.filter(name="h100-1").update(group=training)
    client = api_for(tenancy.acme_member)

    listed = client.get("/api/v1/clusters/").json()["results"]
    assert [(c["name"], c["groups"]) for c in listed] == [("sim", ["training"])]
    assert client.get("/api/v1/specs/", {"purpose": "training", "cluster": "sim"}).status_code == 200
    unknown = client.get("/api/v1/specs/", {"purpose": "inference"})
    assert unknown.status_code == 400 and "training" in unknown.json()["detail"]
    ill_formed = client.get("/api/v1/specs/", {"purpose": "Not A Group"})
    assert ill_formed.status_code == 400 and "purpose" in ill_formed.json()
    body = {"project": tenancy.vision.pk, "items": [{"spec": "h100-80gb.full", "count": 1}]}
    refused = client.post("/api/v1/pool-requests/", {**body, "purpose": "Training!"}, format="json")
    assert refused.status_code == 400 and "purpose" in refused.json()
    assert not PoolRequest.objects.exists()
    taken = client.post("/api/v1/pool-requests/", {**body, "purpose": "training"}, format="json")
    assert taken.status_code == 201 and taken.json()["purpose"] == "training"


def test_the_token_endpoint_documents_wrong_credentials_as_its_400(schema, tenancy, api_client):
    refusals = schema["paths"]["/api/v1/auth/token/"]["post"]["responses"]
    assert "wrong" in refusals["400"]["description"]
    assert refusals["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ValidationError")
    assert all(refusals[code]["description"] != "No response body" for code in ("400", "403", "429"))
    answer = api_client.post("/api/v1/auth/token/", {"username": "alice", "password": "nope"}, format="json")
    assert answer.status_code == 400 and answer.json()["non_field_errors"]
