"""Kubeconfig shapes an operator may paste: each wrong one is refused with a message naming what is wrong."""

from copy import deepcopy

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.config.kube_config import KubeConfigLoader

from pools.models import Cluster
from pools.services import check_kubeconfig
from portal.errors import InvalidInput
from tests.examples import examples

VALID = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "very-secret-token"}}],
    "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "ctx",
}


def kubeconfig(**changes) -> dict:
    """VALID with top-level keys replaced; a value of ... removes the key."""
    document = deepcopy(VALID)
    for key, value in changes.items():
        key = key.replace("_", "-")
        if value is ...:
            document.pop(key)
        else:
            document[key] = value
    return document


def context(**settings) -> list[dict]:
    return [{"name": "ctx", "context": {"cluster": "c", "user": "u", **settings}}]


def text(document) -> str:
    return yaml.safe_dump(document, sort_keys=False)


BAD = {
    "document-a-list": ([VALID], "must be a mapping with clusters, contexts and users"),
    "document-a-string": ("just some words", "must be a mapping"),
    "no-clusters": (kubeconfig(clusters=[]), "no clusters or no contexts"),
    "no-contexts": (kubeconfig(contexts=...), "no clusters or no contexts"),
    "contexts-a-mapping": (
        kubeconfig(contexts={"ctx": {"cluster": "c", "user": "u"}}),
        "contexts must be a list",
    ),
    "contexts-a-string": (kubeconfig(contexts="ctx"), "contexts must be a list"),
    "clusters-a-mapping": (kubeconfig(clusters={"c": {"server": "https://x"}}), "clusters must be a list"),
    "users-a-string": (kubeconfig(users="u"), "users must be a list"),
    "users-a-number": (kubeconfig(users=3), "users must be a list"),
    "cluster-entry-a-string": (kubeconfig(clusters=["c"]), "entry 1 of clusters is not a mapping"),
    "second-context-entry-a-list": (
        kubeconfig(contexts=[*context(), ["ctx"]]),
        "entry 2 of contexts is not a mapping",
    ),
    "user-entry-null": (kubeconfig(users=[None]), "entry 1 of users is not a mapping"),
    "context-without-name": (
        kubeconfig(contexts=[{"context": {"cluster": "c"}}]),
        "entry 1 of contexts has no name",
    ),
    "context-name-a-number": (
        kubeconfig(contexts=[{"name": 7, "context": {"cluster": "c"}}]),
        "entry 1 of contexts has no name",
    ),
    "context-without-context": (kubeconfig(contexts=[{"name": "ctx"}]), "contexts entry ctx has no context"),
    "context-context-a-string": (
        kubeconfig(contexts=[{"name": "ctx", "context": "c"}]),
        "contexts entry ctx has no context mapping",
    ),
    "cluster-without-cluster": (kubeconfig(clusters=[{"name": "c"}]), "clusters entry c has no cluster"),
    "user-user-a-list": (kubeconfig(users=[{"name": "u", "user": ["t"]}]), "users entry u has no user"),
    "two-contexts-of-one-name": (
        kubeconfig(contexts=context() + context()),
        "contexts has two entries named ctx",
    ),
    "current-context-a-list": (kubeconfig(current_context=["ctx"]), "current-context must be a string"),
    "current-context-a-number": (kubeconfig(current_context=1), "current-context must be a string"),
    "current-context-unknown": (
        kubeconfig(current_context="elsewhere"),
        r"no context elsewhere \(it has: ctx\)",
    ),
    "no-current-context": (kubeconfig(current_context=...), "names no current context"),
    "context-names-a-missing-cluster": (
        kubeconfig(contexts=context(cluster="d")),
        "context ctx names no cluster from clusters",
    ),
    "context-cluster-a-list": (
        kubeconfig(contexts=context(cluster=["c"])),
        "context ctx names no cluster",
    ),
    "context-names-a-missing-user": (
        kubeconfig(contexts=context(user="v")),
        "context ctx names a user that is not in users",
    ),
    "context-names-a-user-but-no-users": (kubeconfig(users=...), "names a user that is not in users"),
    "cluster-without-server": (
        kubeconfig(clusters=[{"name": "c", "cluster": {"insecure-skip-tls-verify": True}}]),
        "cluster c has no server",
    ),
    "server-a-number": (
        kubeconfig(clusters=[{"name": "c", "cluster": {"server": 6443}}]),
        "server of clusters entry c must be a string",
    ),
    "token-a-mapping": (
        kubeconfig(users=[{"name": "u", "user": {"token": {"value": "t"}}}]),
        "token of users entry u must be a string",
    ),
    "exec-a-string": (
        kubeconfig(users=[{"name": "u", "user": {"exec": "aws eks get-token"}}]),
        "users entry u uses exec",
    ),
}


@pytest.mark.parametrize(("document", "message"), BAD.values(), ids=BAD.keys())
def test_a_kubeconfig_of_the_wrong_shape_is_refused_saying_what_is_wrong(document, message):
    with pytest.raises(InvalidInput, match=message):
        check_kubeconfig(text(document), "")


@pytest.mark.parametrize(
    ("document", "chosen"),
    [
        (VALID, ""),
        (VALID, "ctx"),
        (kubeconfig(current_context=...), "ctx"),  # the context given wins over a missing current one
        (kubeconfig(users=..., contexts=[{"name": "ctx", "context": {"cluster": "c"}}]), ""),  # no user
        (kubeconfig(users=None, contexts=context(user="")), ""),
        (  # only the cluster and user in use must be complete
            kubeconfig(clusters=[*VALID["clusters"], {"name": "spare", "cluster": {}}]),
            "",
        ),
    ],
    ids=["current-context", "chosen", "chosen-without-current", "no-user", "empty-user", "spare-cluster"],
)
def test_a_kubeconfig_of_the_right_shape_is_accepted(document, chosen):
    check_kubeconfig(text(document), chosen)
    KubeConfigLoader(config_dict=yaml.safe_load(text(document)), active_context=chosen or None)


def test_the_command_refuses_a_wrong_shape_with_its_message(db, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(text(kubeconfig(contexts={"ctx": {"cluster": "c"}})))
    with pytest.raises(CommandError, match=r"In the kubeconfig, contexts must be a list\."):
        call_command("register_cluster", "prod", "--kubeconfig", str(path), "--no-sync")
    assert not Cluster.objects.exists()


def test_the_admin_refuses_a_wrong_shape_with_its_message(db, staff_user, client):
    client.force_login(staff_user("operator"))
    response = client.post(
        reverse("admin:pools_cluster_add"),
        {
            "name": "gpu-east",
            "driver": "kubernetes",
            "context": "",
            "mig_config_map": "gpu-operator/custom-mig-parted-config",
            "kubeconfig": text(kubeconfig(contexts="ctx")),
        },
    )
    assert response.status_code == 200
    assert "In the kubeconfig, contexts must be a list." in response.content.decode()
    assert not Cluster.objects.exists()


# --- whatever arrives, the answer is InvalidInput or nothing ---------------------------------------------

yamlish = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)
names = st.sampled_from(["c", "u", "ctx", ""]) | yamlish


def entries(key: str, settings: dict) -> st.SearchStrategy:
    """A list of kubeconfig entries that are nearly right, so the deeper checks are reached too."""
    entry = st.fixed_dictionaries(
        {}, optional={"name": names, key: st.fixed_dictionaries({}, optional=settings) | yamlish}
    )
    return st.lists(entry | yamlish, max_size=3)


kubeconfigish = st.fixed_dictionaries(
    {},
    optional={
        "clusters": entries("cluster", {"server": st.just("https://127.0.0.1:6443") | yamlish}) | yamlish,
        "contexts": entries("context", {"cluster": names, "user": names}) | yamlish,
        "users": entries("user", {"token": yamlish, "exec": yamlish}) | yamlish,
        "current-context": names,
    },
)


@settings(max_examples=examples(300), deadline=None)
@given(document=yamlish | kubeconfigish, chosen=st.sampled_from(["", "ctx"]) | st.text(max_size=8))
def test_any_document_is_accepted_or_refused_with_invalid_input(document, chosen):
    try:
        check_kubeconfig(text(document), chosen)
    except InvalidInput as refused:
        assert refused.message
    else:  # what is accepted, the Kubernetes client can pick its context from
        KubeConfigLoader(config_dict=document, active_context=chosen or None)


@settings(max_examples=examples(200), deadline=None)
@given(raw=st.text(max_size=200) | st.sampled_from(["a: !!int ''", "a: !!timestamp abc", "[" * 3000]))
def test_any_text_is_accepted_or_refused_with_invalid_input(raw):
    try:
        check_kubeconfig(raw, "")
    except InvalidInput as refused:
        assert refused.message
