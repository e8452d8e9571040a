"""Clusters are registered through one service, whether from the admin or the command line: the same
checks, the same storage, and a sync asked of a worker once a cluster is added in the admin."""

import pytest
from django.core.management import call_command
from django.urls import reverse

from pools import task_names
from pools.models import Cluster
from pools.services import ClusterSettings, register_cluster
from portal import dispatch
from portal.errors import InvalidInput
from tests.pools.test_operators import KUBECONFIG

OTHER_KUBECONFIG = KUBECONFIG.replace("very-secret-token", "another-token")


def add_form(**fields) -> dict:
    return {
        "name": "gpu-east",
        "driver": "kubernetes",
        "context": "",
        "mig_config_map": "gpu-operator/custom-mig-parted-config",
        "kubeconfig": KUBECONFIG,
        **fields,
    }


def test_adding_a_cluster_in_the_admin_asks_a_worker_to_read_it(
    db, staff_user, client, django_capture_on_commit_callbacks
):
    client.force_login(staff_user("operator"))
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(reverse("admin:pools_cluster_add"), add_form())
    assert response.status_code == 302
    cluster = Cluster.objects.get(name="gpu-east")
    assert cluster.kubeconfig() == KUBECONFIG
    assert [(c.task, c.args) for c in callbacks if isinstance(c, dispatch.Send)] == [
        (task_names.SYNC, (cluster.pk,))
    ]


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"driver": "simulated"}, "kubeconfig", "takes no Kubernetes credentials"),
        ({"mig_config_map": "no-slash"}, "mig_config_map", "namespace/name"),
        ({"device_plugin_config_map": "no-slash"}, "device_plugin_config_map", "namespace/name"),
        ({"kubeconfig": ""}, "kubeconfig", "needs a kubeconfig"),
        ({"context": "elsewhere"}, "kubeconfig", "elsewhere"),
    ],
    ids=[
        "simulated-with-credentials",
        "config-map",
        "device-plugin-config-map",
        "no-kubeconfig",
        "unknown-context",
    ],
)
def test_the_admin_refuses_what_the_service_refuses_beside_the_field(
    fields, field, words, db, staff_user, client
):
    client.force_login(staff_user("operator"))
    response = client.post(reverse("admin:pools_cluster_add"), add_form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert words in " ".join(errors[field])
    assert not Cluster.objects.exists()
    with pytest.raises(InvalidInput, match=words):
        form = add_form(**fields)
        register_cluster(ClusterSettings(**{**form, "kubeconfig": form["kubeconfig"] or None}))


def test_a_changed_cluster_keeps_its_name_driver_and_stored_kubeconfig(db, staff_user, client):
    cluster, _created = register_cluster(ClusterSettings(name="gpu-east", kubeconfig=KUBECONFIG))
    client.force_login(staff_user("operator"))
    url = reverse("admin:pools_cluster_change", args=[cluster.pk])
    response = client.post(url, add_form(name="renamed", driver="simulated", kubeconfig="", context="ctx"))
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert (cluster.name, cluster.driver, cluster.context) == ("gpu-east", "kubernetes", "ctx")
    assert cluster.kubeconfig() == KUBECONFIG
    # A context the stored kubeconfig lacks is refused, though no new kubeconfig was pasted.
    response = client.post(url, add_form(kubeconfig="", context="elsewhere"))
    assert response.status_code == 200 and "elsewhere" in response.content.decode()
    cluster.refresh_from_db()
    assert cluster.context == "ctx"
    # A pasted kubeconfig replaces the stored one.
    assert client.post(url, add_form(kubeconfig=OTHER_KUBECONFIG)).status_code == 302
    cluster.refresh_from_db()
    assert cluster.kubeconfig() == OTHER_KUBECONFIG


def test_the_command_keeps_the_stored_kubeconfig_when_none_is_given(db, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    call_command("register_cluster", "gpu-east", "--kubeconfig", str(path), "--no-sync")
    call_command("register_cluster", "gpu-east", "--context", "ctx", "--no-sync")
    cluster = Cluster.objects.get(name="gpu-east")
    assert cluster.kubeconfig() == KUBECONFIG and cluster.context == "ctx"


def test_a_simulated_cluster_cannot_become_a_kubernetes_one(db):
    register_cluster(ClusterSettings(name="sim", driver="simulated"))
    with pytest.raises(InvalidInput, match="is a simulated cluster"):
        register_cluster(ClusterSettings(name="sim", kubeconfig=KUBECONFIG))
    assert Cluster.objects.get(name="sim").kubeconfig() == ""


def test_a_prometheus_url_is_set_kept_and_cleared_from_the_command_line(
    db, tmp_path, private_networks_allowed
):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    url = "http://prometheus.monitoring:9090"
    call_command(
        "register_cluster", "gpu-east", "--kubeconfig", str(path), "--prometheus-url", url, "--no-sync"
    )
    call_command("register_cluster", "gpu-east", "--context", "ctx", "--no-sync")
    assert Cluster.objects.get(name="gpu-east").prometheus_url == url

    call_command("register_cluster", "gpu-east", "--prometheus-url", "", "--no-sync")
    assert Cluster.objects.get(name="gpu-east").prometheus_url == ""


@pytest.mark.parametrize(
    "url", ["ftp://prometheus:9090", "prometheus:9090", "http://" + "p" * 200 + ".example"]
)
def test_a_prometheus_url_that_is_not_one_is_refused_beside_its_field(url, db):
    with pytest.raises(InvalidInput, match="Prometheus URL") as refused:
        register_cluster(ClusterSettings(name="sim", driver="simulated", prometheus_url=url))
    assert refused.value.field == "prometheus_url"
    assert not Cluster.objects.exists()


def test_the_admin_sets_a_clusters_prometheus_url(db, staff_user, client, private_networks_allowed):
    client.force_login(staff_user("operator"))
    url = "https://prometheus.example:9090"

    answer = client.post(reverse("admin:pools_cluster_add"), add_form(prometheus_url=url))

    assert answer.status_code == 302
    assert Cluster.objects.get(name="gpu-east").prometheus_url == url


def test_the_device_plugin_config_map_is_set_and_kept_from_the_command_line_and_the_admin(
    db, tmp_path, staff_user, client
):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    call_command("register_cluster", "gpu-east", "--kubeconfig", str(path), "--no-sync")
    assert (
        Cluster.objects.get(name="gpu-east").device_plugin_config_map
        == "gpu-operator/gpu-portal-device-plugin"
    )
    call_command(
        "register_cluster", "gpu-east", "--device-plugin-config-map", "nvidia/plugin-configs", "--no-sync"
    )
    call_command("register_cluster", "gpu-east", "--context", "ctx", "--no-sync")
    cluster = Cluster.objects.get(name="gpu-east")
    assert cluster.device_plugin_config_map_ref == ("nvidia", "plugin-configs")

    client.force_login(staff_user("operator"))
    url = reverse("admin:pools_cluster_change", args=[cluster.pk])
    assert client.post(url, add_form(kubeconfig="", context="ctx")).status_code == 302  # left empty: kept
    assert Cluster.objects.get(name="gpu-east").device_plugin_config_map == "nvidia/plugin-configs"
    form = add_form(kubeconfig="", context="ctx", device_plugin_config_map="gpu-operator/plugins")
    assert client.post(url, form).status_code == 302
    assert Cluster.objects.get(name="gpu-east").device_plugin_config_map == "gpu-operator/plugins"
