"""Bare views (AppPlugin.bare_views, portal.middleware.BareViewMiddleware): a node agent's POST is served
past the site's guards without the rest of the middleware, and still meets every guard and rule a request
of the whole stack meets: the host check, the HTTPS redirect, the request's log line, the caller's language,
the answer's length; any other request to the same address goes through the whole stack."""

import json
import logging

import pytest

from monitoring.ingest import tokens as agents
from portal import middleware, shell
from tests.factories import ClusterFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/monitoring/samples/"


@pytest.fixture
def key():
    return agents.issue_agent_token(cluster=ClusterFactory(name="sim"), name="gpu-node-1").key


def post(client, key, body=None, **extra):
    data = json.dumps(body if body is not None else {"readings": 5})
    auth = {"HTTP_AUTHORIZATION": f"Bearer {key}"}
    return client.post(URL, data, content_type="application/json", **auth, **extra)


def reaches_the_stack(monkeypatch) -> list[str]:
    """Records each request that goes on past BareViewMiddleware into the rest of the stack."""
    passed: list[str] = []
    call = middleware.BareViewMiddleware.__call__

    def recording(self, request):
        original = self.get_response

        def onward(request):
            passed.append(request.path)
            return original(request)

        self.get_response = onward
        try:
            return call(self, request)
        finally:
            self.get_response = original

    monkeypatch.setattr(middleware.BareViewMiddleware, "__call__", recording)
    return passed


def test_the_agents_post_is_served_bare_and_other_requests_go_through_the_stack(client, key, monkeypatch):
    passed = reaches_the_stack(monkeypatch)
    bare = post(client, key)
    with_query = client.post(
        URL + "?format=json", "{}", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    client.get(URL, HTTP_AUTHORIZATION=f"Bearer {key}")

    assert bare.status_code == 400 and bare.json()["code"] == "invalid"
    assert with_query.status_code == 400
    assert passed == [URL, URL]  # the query and the GET, not the plain POST
    assert "sessionid" not in bare.cookies and "csrftoken" not in bare.cookies


def test_every_bare_view_named_by_an_app_resolves_to_a_view_that_says_what_it_serves():
    names = [name for plugin in shell.plugins() for name in plugin.bare_views]
    matches = middleware.BareViewMiddleware(lambda request: None).matches()

    assert names == ["v1:monitoring-samples"]
    assert list(matches) == [URL]
    assert all(callable(match.func.view_class.serves_bare) for match in matches.values())


def test_a_host_not_allowed_is_a_400(client, key):
    assert post(client, key, HTTP_HOST="elsewhere.example").status_code == 400


def test_the_https_redirect_comes_first(client, key, settings):
    settings.SECURE_SSL_REDIRECT = True
    response = post(client, key)

    assert response.status_code == 301 and response["Location"].startswith("https://")


def test_the_answer_speaks_the_callers_language_and_says_its_length(client, key):
    korean = post(client, key, HTTP_ACCEPT_LANGUAGE="ko")
    english = post(client, key)

    assert korean.json()["detail"] == "배치가 올바르지 않습니다. errors 항목을 확인하세요."
    assert english.json()["detail"] == "The batch is not valid: see errors."
    assert int(korean["Content-Length"]) == len(korean.content)


def test_the_request_is_logged_and_counted_as_any_other(client, key, caplog):
    with caplog.at_level(logging.INFO, logger="portal.requests"):
        post(client, key)

    [line] = [record for record in caplog.records if record.name == "portal.requests"]
    assert line.route == "api/v1/monitoring/samples/" and line.status == 400
