"""What operators do in the admin: register clusters, drain GPUs and nodes, group nodes."""

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from pools.models import Cluster, GpuCapacity, NodeCapacity
from pools.services import set_node_group
from pools.services.inventory import sync_inventory
from portal.errors import InvalidInput
from tests.factories import ClusterFactory, GpuGroupFactory

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: very-secret-token}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


@pytest.fixture
def synced(sim_cluster):
    sync_inventory(cluster=sim_cluster)
    return sim_cluster


@pytest.mark.parametrize(
    ("action", "drained"),
    [("drain", True), ("undrain", False)],
)
def test_operators_drain_and_undrain_gpus_and_nodes(action, drained, synced, staff_user, client):
    GpuCapacity.objects.update(drained=not drained)
    NodeCapacity.objects.update(drained=not drained)
    client.force_login(staff_user("operator"))
    gpu = GpuCapacity.objects.get(node__name="h100-1", index=2)
    node = NodeCapacity.objects.get(name="h200-1")
    for model, obj in (("gpucapacity", gpu), ("nodecapacity", node)):
        response = client.post(
            reverse(f"admin:pools_{model}_changelist"),
            {"action": action, "_selected_action": [obj.pk]},
        )
        assert response.status_code == 302
        obj.refresh_from_db()
        assert obj.drained is drained
    assert GpuCapacity.objects.filter(drained=drained).count() == 1  # only the one selected


def test_approvers_cannot_drain(synced, staff_user, client):
    client.force_login(staff_user("approver"))
    gpu = GpuCapacity.objects.first()
    response = client.post(
        reverse("admin:pools_gpucapacity_changelist"), {"action": "drain", "_selected_action": [gpu.pk]}
    )
    gpu.refresh_from_db()
    assert response.status_code < 500
    assert not gpu.drained  # the action is not offered without the change permission


def test_a_node_joins_one_group_of_its_own_cluster(synced, staff_user, client):
    training = GpuGroupFactory(cluster=synced, name="training")
    elsewhere = GpuGroupFactory(cluster__name="other", name="training")
    node = NodeCapacity.objects.get(name="h100-1")
    set_node_group(node=node, group=training)
    assert NodeCapacity.objects.get(pk=node.pk).group == training
    with pytest.raises(InvalidInput, match="another cluster"):
        set_node_group(node=node, group=elsewhere)
    client.force_login(staff_user("operator"))
    page = client.get(reverse("admin:pools_nodecapacity_change", args=[node.pk])).content.decode()
    assert f'value="{training.pk}"' in page and f'value="{elsewhere.pk}"' not in page
    api = client.get("/api/v1/capacity/nodes/?group=training").json()["results"]
    assert [n["name"] for n in api] == ["h100-1"]


def test_register_cluster_stores_the_kubeconfig_encrypted_and_never_prints_it(db, tmp_path, capsys):
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    call_command(
        "register_cluster", "prod-1", "--kubeconfig", str(path), "--mig-config-map", "gpu/mig", "--no-sync"
    )
    cluster = Cluster.objects.get(name="prod-1")
    assert cluster.driver == "kubernetes" and cluster.mig_config_map == "gpu/mig"
    assert "very-secret-token" not in cluster.kubeconfig_encrypted
    assert cluster.kubeconfig() == KUBECONFIG
    call_command("register_cluster", "prod-1", "--kubeconfig", str(path), "--context", "ctx", "--no-sync")
    assert Cluster.objects.get(name="prod-1").context == "ctx"
    assert "very-secret-token" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "text", "context", "message"),
    [
        ("Bad_Name", KUBECONFIG, "", "lower-case"),
        ("ok", "clusters: [", "", "not valid YAML"),
        ("ok", "apiVersion: v1\n", "", "no clusters"),
        ("ok", KUBECONFIG, "nope", "no context nope"),
    ],
)
def test_register_cluster_refuses_bad_input_and_writes_nothing(name, text, context, message, db, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    args = ["register_cluster", name, "--kubeconfig", str(path), "--no-sync"]
    with pytest.raises(CommandError, match=message):
        call_command(*args, *(["--context", context] if context else []))
    assert not Cluster.objects.exists()


def test_register_cluster_with_a_missing_file_says_so(db, tmp_path):
    with pytest.raises(CommandError, match="Cannot read"):
        call_command("register_cluster", "ok", "--kubeconfig", str(tmp_path / "absent"))


def test_the_cluster_admin_never_shows_the_kubeconfig(db, client):
    from tests.factories import UserFactory

    cluster = ClusterFactory(name="prod", driver="kubernetes", kubeconfig=KUBECONFIG)
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    page = client.get(reverse("admin:pools_cluster_change", args=[cluster.pk])).content.decode()
    assert "very-secret-token" not in page and cluster.kubeconfig_encrypted not in page
    response = client.post(
        reverse("admin:pools_cluster_change", args=[cluster.pk]),
        {
            "name": "prod",
            "driver": "kubernetes",
            "context": "",
            "mig_config_map": "gpu/mig",
            "kubeconfig": "",
        },
    )
    assert response.status_code == 302
    cluster.refresh_from_db()
    assert cluster.kubeconfig() == KUBECONFIG and cluster.mig_config_map == "gpu/mig"


@pytest.mark.parametrize(
    ("kubeconfig", "created"),
    [(KUBECONFIG, True), ("", False), ("clusters: [", False)],
    ids=["valid", "missing", "not-yaml"],
)
def test_operators_add_clusters_in_the_admin(kubeconfig, created, db, staff_user, client):
    client.force_login(staff_user("operator"))
    response = client.post(
        reverse("admin:pools_cluster_add"),
        {
            "name": "gpu-east",
            "driver": "kubernetes",
            "context": "",
            "mig_config_map": "gpu-operator/custom-mig-parted-config",
            "kubeconfig": kubeconfig,
        },
    )
    assert response.status_code == (302 if created else 200)
    assert Cluster.objects.filter(name="gpu-east").exists() == created
    if created:
        assert Cluster.objects.get(name="gpu-east").kubeconfig() == KUBECONFIG


def test_undraining_runs_the_queue_draining_does_not(synced, django_capture_on_commit_callbacks):
    from pools import task_names
    from pools.services import set_gpu_drained, set_node_drained
    from portal import dispatch

    gpu = GpuCapacity.objects.first()
    with django_capture_on_commit_callbacks() as drained:
        set_gpu_drained(gpu=gpu, drained=True)
    with django_capture_on_commit_callbacks() as undrained:
        set_gpu_drained(gpu=gpu, drained=False)
        set_node_drained(node=gpu.node, drained=False)  # already undrained: no change, no run

    def queue_runs(callbacks) -> int:
        return sum(isinstance(c, dispatch.Send) and c.task == task_names.ADMIT for c in callbacks)

    assert (queue_runs(drained), queue_runs(undrained)) == (0, 1)
