"""Agent tokens: issued for a cluster with the key shown once, found by key while live, revoked in the
admin (in bulk or on the token's page); the key is never shown again."""

import hashlib
import re
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.core.exceptions import ValidationError
from django.utils import timezone

from monitoring.ingest import copies
from monitoring.ingest import tokens as agents
from monitoring.models import AgentToken
from portal.errors import InvalidInput
from tests.factories import ClusterFactory, UserFactory

pytestmark = pytest.mark.django_db

ADMIN = "/admin/monitoring/agenttoken/"


@pytest.fixture
def cluster():
    return ClusterFactory(name="seoul-a")


def test_a_token_keeps_only_the_digest_and_prefix_of_its_256_bit_key(cluster):
    issued = agents.issue_agent_token(cluster=cluster, name=" node-1 ")

    token = AgentToken.objects.get()
    assert len(issued.key) >= 43  # 32 random bytes, URL-safe base64
    assert token.digest == hashlib.sha256(issued.key.encode()).hexdigest()
    assert token.prefix == issued.key[:8] and token.name == "node-1"
    assert issued.key not in {str(value) for value in AgentToken.objects.values().get().values()}
    assert agents.issue_agent_token(cluster=cluster, name="node-1").key != issued.key


@pytest.mark.parametrize("name", ["", "   ", "n" * 101])
def test_a_token_needs_a_name_of_sane_length(cluster, name):
    with pytest.raises(InvalidInput):
        agents.issue_agent_token(cluster=cluster, name=name)
    assert not AgentToken.objects.exists()


CONTROL = ["node\n1", "node\r1", "node\t1", "node\x1b1", "node\x851", "node\u20281"]


@pytest.mark.parametrize("name", CONTROL)
def test_a_token_name_holds_no_control_characters_however_it_is_given(cluster, operator, name):
    """A token's name goes into the subjects of its alerts' e-mails, which hold one line of text."""
    with pytest.raises(InvalidInput, match="control characters"):
        agents.issue_agent_token(cluster=cluster, name=name)
    response = operator.post(ADMIN + "add/", {"cluster": cluster.pk, "name": name})
    assert response.status_code == 200
    assert "control characters" in " ".join(response.context["adminform"].form.errors["name"])
    with pytest.raises(ValidationError, match="control characters"):
        AgentToken(cluster=cluster, name=name, prefix="p", digest="d").full_clean()
    assert not AgentToken.objects.exists()


def test_a_key_finds_its_live_token_and_a_revoked_or_unknown_key_none(cluster):
    issued = agents.issue_agent_token(cluster=cluster, name="node-1")

    found = agents.agent_token_for_key(issued.key)
    assert found == issued.token and found.cluster == cluster
    assert agents.agent_token_for_key(("y" if issued.key[0] == "x" else "x") + issued.key[1:]) is None
    assert agents.agent_token_for_key("") is None

    revoked = agents.revoke_agent_token(token=issued.token)
    first = revoked.revoked_at
    assert agents.agent_token_for_key(issued.key) is None
    assert agents.revoke_agent_token(token=issued.token).revoked_at == first  # twice: the first time stays


def test_use_is_written_at_most_once_a_minute_and_the_host_when_it_changes(
    cluster, django_assert_num_queries
):
    issued = agents.issue_agent_token(cluster=cluster, name="node-1")
    token = agents.agent_token_for_key(issued.key)
    first = token.last_used_at
    assert first is not None

    with django_assert_num_queries(0):  # this process's copy: nothing read, nothing written within the minute
        assert agents.agent_token_for_key(issued.key).last_used_at == first
    AgentToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    copies.forget_all()  # as a process that holds no copy of it
    with django_assert_num_queries(2):  # read, and its use written
        assert agents.agent_token_for_key(issued.key).last_used_at > first - timedelta(minutes=2)

    agents.record_agent_hosts({token.pk: (timezone.now(), "gpu-node-1")})  # the first host it brought
    assert AgentToken.objects.get().last_host == "gpu-node-1"


def test_finding_a_token_reads_it_with_its_clusters_name_in_one_query_and_writes_nothing(
    cluster, django_assert_num_queries
):
    issued = agents.issue_agent_token(cluster=cluster, name="node-1")

    with django_assert_num_queries(1):
        token = agents.find_agent_token(issued.key)
        assert (token, token.cluster.name) == (issued.token, "seoul-a")
    assert AgentToken.objects.get().last_used_at is None
    agents.revoke_agent_token(token=issued.token)
    assert agents.find_agent_token(issued.key) is None


def test_a_token_shared_by_many_hosts_notes_one_of_them_a_minute(cluster, django_assert_num_queries):
    shared = agents.issue_agent_token(cluster=cluster, name="every node").token
    other = agents.issue_agent_token(cluster=cluster, name="node-9").token
    now = timezone.now()
    agents.record_agent_hosts({shared.pk: (now, "gpu-node-1"), other.pk: (now, "node-9")})

    with django_assert_num_queries(1):  # one statement for every token, whatever it writes
        agents.record_agent_hosts({shared.pk: (now + timedelta(seconds=15), "gpu-node-2")})
    shared.refresh_from_db()
    assert (shared.last_host, shared.last_used_at) == ("gpu-node-1", now)  # within the minute: as it was

    agents.record_agent_hosts({shared.pk: (now + timedelta(minutes=1), "gpu-node-3")})
    shared.refresh_from_db()
    assert (shared.last_host, shared.last_used_at) == ("gpu-node-3", now + timedelta(minutes=1))
    other.refresh_from_db()
    assert (other.last_host, other.last_used_at) == ("node-9", now)


@pytest.fixture
def operator(client, settings):
    settings.STAFF_REQUIRE_TOTP = False
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    return client


def _messages(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_adding_a_token_in_the_admin_shows_its_key_once(operator, cluster):
    form = operator.get(ADMIN + "add/").content.decode()
    assert 'name="cluster"' in form and 'name="name"' in form and 'name="digest"' not in form

    response = operator.post(ADMIN + "add/", {"cluster": cluster.pk, "name": "gpu-node-1"}, follow=True)

    token = AgentToken.objects.get()
    assert token.created_by.username == "root" and token.cluster == cluster
    [key] = [m for text in _messages(response) for m in re.findall(r"once: (\S+)", text)]
    assert agents.agent_token_for_key(key) == token
    for page in (ADMIN, f"{ADMIN}{token.pk}/change/"):
        body = operator.get(page).content.decode()
        assert token.prefix in body and key not in body
    listing = operator.get(ADMIN).content.decode()
    assert "seoul-a" in listing and "gpu-node-1" in listing


def test_a_token_is_revoked_on_its_page_and_then_offers_no_revoke(operator, cluster):
    issued = agents.issue_agent_token(cluster=cluster, name="gpu-node-1")
    page = f"{ADMIN}{issued.token.pk}/change/"
    assert 'name="_revoke"' in operator.get(page).content.decode()
    assert 'name="_save"' not in operator.get(page).content.decode()  # nothing else to change

    response = operator.post(page, {"_revoke": "1"})

    assert response.status_code == 302 and response["Location"] == page
    assert agents.agent_token_for_key(issued.key) is None
    assert 'name="_revoke"' not in operator.get(page).content.decode()


def test_the_revoke_action_revokes_the_selected_live_tokens(operator, cluster):
    keep, gone = (agents.issue_agent_token(cluster=cluster, name=name) for name in ("keep", "gone"))

    response = operator.post(
        ADMIN, {"action": "revoke_selected", "_selected_action": [gone.token.pk]}, follow=True
    )

    assert "1 token revoked." in _messages(response)
    assert agents.agent_token_for_key(gone.key) is None
    assert agents.agent_token_for_key(keep.key) == keep.token


def test_a_live_token_cannot_be_deleted_only_revoked(operator, cluster):
    issued = agents.issue_agent_token(cluster=cluster, name="gpu-node-1")
    delete = f"{ADMIN}{issued.token.pk}/delete/"

    assert operator.post(delete, {"post": "yes"}).status_code == 403
    agents.revoke_agent_token(token=issued.token)
    assert operator.post(delete, {"post": "yes"}).status_code == 302
    assert not AgentToken.objects.exists()


def test_revoked_and_last_used_show_in_the_list(operator, cluster):
    issued = agents.issue_agent_token(cluster=cluster, name="gpu-node-1")
    AgentToken.objects.filter(pk=issued.token.pk).update(
        last_host="gpu-node-1.example", revoked_at=timezone.now()
    )

    listing = operator.get(ADMIN + "?revoked_at__isnull=False").content.decode()
    assert "gpu-node-1.example" in listing and issued.token.prefix in listing
