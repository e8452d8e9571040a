"""Whatever JSON arrives, the API answers 2xx or a 4xx with a message: never a 500."""

from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.examples import examples

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=80),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
project_like = st.fixed_dictionaries(
    {},
    optional={
        "tenant": st.sampled_from(["acme", "globex", "", "x" * 40]) | json_values,
        "slug": st.text(max_size=40) | json_values,
        "name": st.text(max_size=120) | json_values,
        "namespace": st.text(max_size=70) | json_values,
        "description": st.text(max_size=50) | json_values,
    },
)
FUZZ = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("path", ["/api/v1/projects/", "/api/v1/auth/token/"])
@FUZZ
@given(body=project_like | json_values)
def test_posts_never_fail_with_a_server_error(path, body, tenancy, api_for):
    client = api_for(tenancy.acme_admin)
    response = client.post(path, body, format="json")
    assert response.status_code < 500
    if response.status_code >= 400:
        assert response.json()  # a message, in JSON
    else:
        assert response.status_code in {200, 201}


@FUZZ
@given(segment=st.text(min_size=1, max_size=30).filter(lambda s: "/" not in s and s not in {".", ".."}))
def test_odd_addresses_are_404_not_500(segment, tenancy, api_for):
    client = api_for(tenancy.acme_member)
    client.force_login(tenancy.acme_member)
    for path in (
        f"/api/v1/projects/{quote(segment)}/",
        f"/t/{quote(segment)}/",
        f"/invitations/{quote(segment)}/",
    ):
        expected = {400} if "\x00" in segment else {200, 404}  # NUL is refused before any lookup
        assert client.get(path).status_code in expected
