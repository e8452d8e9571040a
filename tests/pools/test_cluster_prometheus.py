"""A cluster's Prometheus: the user:password of its URL stored encrypted apart from the address and never
shown, whoever reads the cluster; and the address itself one the portal may send requests to, however the
cluster is registered."""

import importlib

import pytest
from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse

from pools.models import Cluster
from pools.services import ClusterSettings, register_cluster
from portal.errors import InvalidInput
from tests.factories import ClusterFactory
from tests.pools.test_cluster_registration import add_form
from tests.pools.test_operators import KUBECONFIG

WITH_PASSWORD = "http://portal:hunter2@prometheus.example:9090"
PLAIN = "http://prometheus.example:9090"

migration = importlib.import_module("pools.migrations.0008_cluster_prometheus_credential")


def stored_row(cluster: Cluster) -> str:
    """Every column of the cluster's row, as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pools_cluster::text FROM pools_cluster WHERE id = %s", [cluster.pk])
        return cursor.fetchone()[0]


@pytest.fixture
def registered(db, tmp_path, private_networks_allowed):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    call_command("register_cluster", "gpu-east", "--kubeconfig", str(path), "--prometheus-url", WITH_PASSWORD,
                 "--no-sync")  # fmt: skip
    return Cluster.objects.get(name="gpu-east")


def test_the_password_of_a_prometheus_url_is_stored_encrypted_apart_from_the_address(registered):
    assert registered.prometheus_url == PLAIN
    assert registered.has_prometheus_credential and registered.prometheus_credential() == "portal:hunter2"
    assert "hunter2" not in stored_row(registered)
    # The collector alone gets it back, as the URL's user part (basic auth).
    assert registered.prometheus_read_url() == WITH_PASSWORD


@pytest.mark.parametrize("role", ["operator", "approver", "finance"])
def test_no_one_reads_the_prometheus_password_or_the_kubeconfig_on_the_clusters_pages(
    role, registered, staff_user, client
):
    client.force_login(staff_user(role))
    for page in ("admin:pools_cluster_change", "admin:pools_cluster_changelist"):
        url = reverse(page, args=[registered.pk] if page.endswith("change") else [])
        text = client.get(url).content.decode()
        assert "hunter2" not in text and "very-secret-token" not in text
    change = client.get(reverse("admin:pools_cluster_change", args=[registered.pk])).content.decode()
    assert PLAIN in change


def test_the_stored_credential_stays_for_the_same_server_and_goes_for_another(registered, staff_user, client):
    # Saved in the admin unchanged (the form shows the address alone): the credential stays.
    client.force_login(staff_user("operator"))
    url = reverse("admin:pools_cluster_change", args=[registered.pk])
    assert client.post(url, add_form(kubeconfig="", prometheus_url=PLAIN)).status_code == 302
    registered.refresh_from_db()
    assert (registered.prometheus_url, registered.prometheus_credential()) == (PLAIN, "portal:hunter2")

    register_cluster(
        ClusterSettings(name="gpu-east", prometheus_url="http://portal:n3w@prometheus.example:9090")
    )
    registered.refresh_from_db()
    assert (registered.prometheus_url, registered.prometheus_credential()) == (PLAIN, "portal:n3w")

    # Another server never gets the password given for the first one.
    register_cluster(ClusterSettings(name="gpu-east", prometheus_url="http://elsewhere.example:9090"))
    registered.refresh_from_db()
    assert (registered.prometheus_url, registered.has_prometheus_credential) == (
        "http://elsewhere.example:9090",
        False,
    )

    register_cluster(ClusterSettings(name="gpu-east", prometheus_url=WITH_PASSWORD))
    call_command("register_cluster", "gpu-east", "--prometheus-url", "", "--no-sync")
    registered.refresh_from_db()
    assert (registered.prometheus_url, registered.prometheus_credential_encrypted) == ("", "")


def test_the_migration_moves_a_password_out_of_a_stored_url(db):
    cluster = ClusterFactory(name="old")
    # As a row saved before the credential had a place of its own.
    Cluster.objects.filter(pk=cluster.pk).update(prometheus_url=WITH_PASSWORD)
    untouched = ClusterFactory(name="plain")
    Cluster.objects.filter(pk=untouched.pk).update(prometheus_url="http://prometheus.example/at@path")

    migration.move_credentials(apps, None)

    cluster.refresh_from_db()
    untouched.refresh_from_db()
    assert (cluster.prometheus_url, cluster.prometheus_credential()) == (PLAIN, "portal:hunter2")
    assert "hunter2" not in stored_row(cluster)
    assert (untouched.prometheus_url, untouched.prometheus_credential_encrypted) == (
        "http://prometheus.example/at@path",
        "",
    )
    migration.restore_credentials(apps, None)
    cluster.refresh_from_db()
    assert (cluster.prometheus_url, cluster.prometheus_credential()) == (WITH_PASSWORD, "portal:hunter2")


# --- the address: refused where it is not public, however it is given ---------------------------------

REFUSED = [
    "http://127.0.0.1:9090",
    "http://localhost:9090",
    "http://169.254.169.254/latest/meta-data",
    "http://10.0.0.7:9090",
    "http://192.168.1.20:9090",
    "http://[::1]:9090",
    "http://[fd00::7]:9090",
    "http://[::ffff:127.0.0.1]:9090",
    "http://0.0.0.0:9090",
    "http://portal:hunter2@127.0.0.1:9090",
]


@pytest.mark.parametrize("url", REFUSED)
def test_a_prometheus_url_that_is_not_public_is_refused_by_the_service_and_the_command(url, db):
    with pytest.raises(InvalidInput, match="not a public address") as refused:
        register_cluster(ClusterSettings(name="sim", driver="simulated", prometheus_url=url))
    assert refused.value.field == "prometheus_url" and "hunter2" not in refused.value.message
    with pytest.raises(CommandError, match="not a public address"):
        call_command("register_cluster", "sim", "--prometheus-url", url, "--no-sync")
    assert not Cluster.objects.exists()


def test_the_admin_and_full_clean_refuse_a_prometheus_url_that_is_not_public(db, staff_user, client):
    client.force_login(staff_user("operator"))
    answer = client.post(
        reverse("admin:pools_cluster_add"), add_form(prometheus_url="http://169.254.169.254/latest")
    )
    assert answer.status_code == 200
    assert "not a public address" in " ".join(answer.context["adminform"].form.errors["prometheus_url"])
    assert not Cluster.objects.exists()

    cluster = ClusterFactory(name="sim")
    cluster.prometheus_url = "http://127.0.0.1:9090"
    with pytest.raises(ValidationError, match="not a public address"):
        cluster.full_clean()


def test_a_name_that_does_not_resolve_is_refused(db):
    with pytest.raises(InvalidInput, match="cannot be resolved"):
        register_cluster(
            ClusterSettings(name="sim", driver="simulated", prometheus_url="http://prometheus.invalid:9090")
        )


def test_operators_allow_their_own_networks(db, settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    cluster, _created = register_cluster(
        ClusterSettings(name="sim", driver="simulated", prometheus_url="http://10.0.0.7:9090")
    )
    assert cluster.prometheus_url == "http://10.0.0.7:9090"
    with pytest.raises(InvalidInput, match="not a public address"):
        register_cluster(ClusterSettings(name="sim", driver="simulated", prometheus_url="http://127.0.0.1:1"))

    settings.OUTBOUND_ALLOW_PRIVATE_NETWORKS = True
    cluster, _created = register_cluster(
        ClusterSettings(name="sim", driver="simulated", prometheus_url="http://127.0.0.1:1")
    )
    assert cluster.prometheus_url == "http://127.0.0.1:1"
