"""What the schema fuzzer found, each kept fixed by a focused test: the answers that were 500s, and the
schema's account of the API where it did not match what the API answers."""

import pytest

from tests.api.openapi import served_schema


@pytest.fixture(scope="module")
def schema() -> dict:
    return served_schema()


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
