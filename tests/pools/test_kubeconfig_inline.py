"""A kubeconfig holds inline credentials only: one that would run a program or read a file on the portal's
workers is refused wherever it comes in (service, admin, command line; the API has no way in), and a stored
one is held to the same rule whenever a client is built from it, so it never runs anything."""

import json
import shlex

import pytest
import yaml
from django.core.management import CommandError, call_command
from django.urls import reverse
from kubernetes.config.kube_config import KubeConfigLoader

from pools.drivers import driver_for
from pools.drivers.base import DriverError
from pools.models import Cluster
from pools.services import check_kubeconfig, sync_inventory
from portal.errors import InvalidInput
from tests.factories import ClusterFactory
from tests.pools.test_cluster_registration import add_form

SERVER = "https://127.0.0.1:1"  # never reached: each refusal comes before any connection


def with_user(user: dict, cluster: dict | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": SERVER, **(cluster or {})}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        },
        sort_keys=False,
    )


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "ran"


@pytest.fixture
def exec_kubeconfig(marker) -> str:
    """A kubeconfig whose `exec` plugin leaves a marker file wherever it runs, then hands back a token."""
    credential = json.dumps(
        {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "kind": "ExecCredential",
            "status": {"token": "t"},
        }
    )
    script = f"touch {shlex.quote(str(marker))}; echo {shlex.quote(credential)}"
    plugin = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "command": "/bin/sh",
        "args": ["-c", script],
    }
    return with_user({"exec": plugin})


def test_the_kubernetes_client_itself_would_run_the_plugin(exec_kubeconfig, marker):
    """What the refusals below keep from happening: building a client from this kubeconfig runs it."""
    KubeConfigLoader(config_dict=yaml.safe_load(exec_kubeconfig)).load_and_set(_Configuration())
    assert marker.exists()


class _Configuration:
    """The little the client's loader writes into: where the token and the server go."""

    def __init__(self):
        self.api_key, self.refresh_api_key_hook = {}, None


def test_the_service_refuses_it_naming_the_field(exec_kubeconfig, marker):
    with pytest.raises(InvalidInput, match="users entry u uses exec, which would run a program"):
        check_kubeconfig(exec_kubeconfig, "")
    assert not marker.exists()


def test_the_command_refuses_it(db, exec_kubeconfig, marker, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(exec_kubeconfig)
    with pytest.raises(CommandError, match="uses exec"):
        call_command("register_cluster", "gpu-east", "--kubeconfig", str(path))
    assert not Cluster.objects.exists()
    assert not marker.exists()


def test_the_admin_refuses_it_beside_the_field(db, staff_user, client, exec_kubeconfig, marker):
    client.force_login(staff_user("operator"))
    response = client.post(reverse("admin:pools_cluster_add"), add_form(kubeconfig=exec_kubeconfig))
    assert response.status_code == 200
    assert "uses exec" in " ".join(response.context["adminform"].form.errors["kubeconfig"])
    assert not Cluster.objects.exists()
    assert not marker.exists()


def test_the_api_takes_no_kubeconfig_at_all(db, staff_user, api_for, exec_kubeconfig, marker):
    api = api_for(staff_user("operator"))
    response = api.post(
        "/api/v1/clusters/", {"name": "gpu-east", "kubeconfig": exec_kubeconfig}, format="json"
    )
    assert response.status_code == 405
    assert not Cluster.objects.exists()
    assert not marker.exists()


def test_a_stored_one_is_refused_at_load_and_its_cluster_marked_failed(db, exec_kubeconfig, marker):
    """Written past every check (a row from before the rule): the sync refuses to build a client from it."""
    cluster = ClusterFactory(name="gpu-east", driver=Cluster.Driver.KUBERNETES, kubeconfig=exec_kubeconfig)
    report = sync_inventory(cluster=cluster)
    assert not report.ok
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.ERROR
    assert "The stored kubeconfig is refused" in cluster.last_error
    assert "uses exec" in cluster.last_error
    with pytest.raises(DriverError, match="uses exec"):  # every other call into the cluster alike
        driver_for(cluster).ensure_namespace("team-a", {})
    assert not marker.exists()


def test_a_stored_one_that_reads_a_file_is_refused_at_load(db, tmp_path):
    secret = tmp_path / "token"
    secret.write_text("the worker's own service account token")
    cluster = ClusterFactory(
        name="gpu-east", driver=Cluster.Driver.KUBERNETES, kubeconfig=with_user({"tokenFile": str(secret)})
    )
    assert not sync_inventory(cluster=cluster).ok
    cluster.refresh_from_db()
    assert cluster.status == Cluster.Status.ERROR
    assert "uses tokenFile, which names a file" in cluster.last_error


@pytest.mark.parametrize(
    ("user", "cluster", "words"),
    [
        ({"exec": {"command": "aws"}}, {}, "users entry u uses exec"),
        ({"auth-provider": {"name": "oidc"}}, {}, "users entry u uses auth-provider"),
        ({"tokenFile": "/var/run/secrets/token"}, {}, "uses tokenFile, which names a file.*give token"),
        ({"client-certificate": "/c.crt"}, {}, "uses client-certificate,.*give client-certificate-data"),
        ({"client-key": "/c.key"}, {}, "uses client-key,.*give client-key-data"),
        ({"token": "t"}, {"certificate-authority": "/ca.crt"}, "clusters entry c uses certificate-authority"),
        ({"token": "t", "as": "admin"}, {}, "users entry u has as, which the portal does not accept"),
    ],
    ids=["exec", "auth-provider", "token-file", "client-certificate", "client-key", "ca-file", "unknown"],
)
def test_anything_but_an_inline_credential_is_refused_by_name(user, cluster, words):
    with pytest.raises(InvalidInput, match=words):
        check_kubeconfig(with_user(user, cluster), "")


def test_an_entry_not_in_use_is_held_to_the_rule_too():
    """The context may change later without a new kubeconfig; no entry is kept that could ever run."""
    document = yaml.safe_load(with_user({"token": "t"}))
    document["users"].append({"name": "spare", "user": {"exec": {"command": "gcloud"}}})
    with pytest.raises(InvalidInput, match="users entry spare uses exec"):
        check_kubeconfig(yaml.safe_dump(document), "")


@pytest.mark.parametrize(
    ("user", "cluster"),
    [
        ({"token": "t"}, {"certificate-authority-data": "Y2E=", "tls-server-name": "api"}),
        ({"client-certificate-data": "Yw==", "client-key-data": "aw=="}, {"insecure-skip-tls-verify": True}),
        ({"username": "admin", "password": "pw"}, {}),
    ],
    ids=["token", "client-certificate", "basic"],
)
def test_inline_credentials_are_accepted(user, cluster):
    assert check_kubeconfig(with_user(user, cluster), "")["current-context"] == "ctx"
