"""A service's refusal that escapes a view answers with its status and message, on pages and in the API."""

import json as json_module

import pytest
from django.test import RequestFactory

from portal.errors import Conflict, NotAllowed
from portal.middleware import RefusalMiddleware


def unreachable(request):
    raise AssertionError("the middleware only handles exceptions here")


@pytest.mark.parametrize(("path", "json"), [("/t/acme/", False), ("/api/v1/pools/", True)])
@pytest.mark.parametrize(
    ("error", "status"), [(Conflict("Changed meanwhile."), 409), (NotAllowed("No."), 403)]
)
def test_a_refusal_escaping_a_view_answers_with_its_status(path, json, error, status, db):
    request = RequestFactory().get(path)
    request.user = None
    response = RefusalMiddleware(unreachable).process_exception(request, error)
    assert response.status_code == status
    if json:
        assert json_module.loads(response.content) == {"detail": error.message}
    else:
        assert error.message in response.content.decode()


def test_other_errors_are_left_to_the_server_error_page():
    request = RequestFactory().get("/")
    assert RefusalMiddleware(unreachable).process_exception(request, ValueError("boom")) is None
