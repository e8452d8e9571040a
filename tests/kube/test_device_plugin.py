"""The test API server's emulation of NVIDIA's device plugin, driven only through the official client: a
node's sharing-config label is applied to its full GPUs' resources and labels, or takes them away, and
agrees with the MIG manager on the node's MIG resources."""

from __future__ import annotations

import time

import pytest

from tests.kube.client import (
    MIG_PARTED_YAML,
    ask_for_device_plugin_config,
    ask_for_mig_config,
    connect,
    gpu_labels,
    mig_count_labels,
    mig_resources,
    sharing_config,
    wait_for_state,
    wait_for_write,
    write_device_plugin_config,
    write_mig_config,
)
from tests.kube.server import KubeApiServer

UNSHARED_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-H200",
    "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.replicas": "1",
    "nvidia.com/gpu.sharing-strategy": "none",
}
VISION_MIXED_MIG = {
    "nvidia.com/mig-1g.18gb": "14",
    "nvidia.com/mig-3g.71gb": "3",
    "nvidia.com/mig-1g.18gb.me": "1",
    "nvidia.com/mig-2g.35gb": "1",
}
CONFIGS = {
    "sliced-4": sharing_config(4, rename_by_default=True),
    "sliced-4-as-gpu": sharing_config(4),
    "mps-2": sharing_config(2, strategy="mps"),
}


def one_resource(entry: str) -> str:
    return f"version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - {entry}\n"


def shared(node: str, kube: KubeApiServer, core, config: str | None, configs: dict[str, str] = CONFIGS):
    """Ask for a config on a fresh node and return the node once the plugin has applied it."""
    kube.add_gpu_node(node)
    write_device_plugin_config(core, configs)
    return wait_for_write(core, ask_for_device_plugin_config(core, node, config))


def test_time_slicing_renamed_advertises_shared_gpus_only(kube, core):
    node = shared("gpu-a", kube, core, "sliced-4")

    assert mig_resources(node) == mig_resources(node, "capacity") == {"nvidia.com/gpu.shared": "32"}
    assert gpu_labels(node) == {
        **UNSHARED_LABELS,
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }


def test_time_slicing_not_renamed_multiplies_gpus_and_marks_the_product(kube, core):
    node = shared("gpu-a", kube, core, "sliced-4-as-gpu")

    assert mig_resources(node) == mig_resources(node, "capacity") == {"nvidia.com/gpu": "32"}
    assert gpu_labels(node) == {
        **UNSHARED_LABELS,
        "nvidia.com/gpu.product": "NVIDIA-H200-SHARED",
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/gpu.sharing-strategy": "time-slicing",
    }


def test_mps_shares_like_time_slicing_under_its_own_strategy(kube, core):
    node = shared("gpu-a", kube, core, "mps-2")

    assert mig_resources(node) == {"nvidia.com/gpu": "16"}
    assert gpu_labels(node) == {
        **UNSHARED_LABELS,
        "nvidia.com/gpu.product": "NVIDIA-H200-SHARED",
        "nvidia.com/gpu.replicas": "2",
        "nvidia.com/gpu.sharing-strategy": "mps",
    }


def test_mps_wins_over_time_slicing(kube, core):
    both = """
version: v1
sharing:
  timeSlicing:
    resources: [{name: nvidia.com/gpu, replicas: 8}]
  mps:
    renameByDefault: true
    resources: [{name: nvidia.com/gpu, replicas: 3}]
"""
    node = shared("gpu-a", kube, core, "both", {"both": both})

    assert mig_resources(node) == {"nvidia.com/gpu.shared": "24"}
    assert gpu_labels(node)["nvidia.com/gpu.sharing-strategy"] == "mps"
    assert gpu_labels(node)["nvidia.com/gpu.replicas"] == "3"


@pytest.mark.parametrize(
    "config_yaml",
    [
        # No version is v1; `gpu` is `nvidia.com/gpu`; devices other than all and renames are ignored.
        "sharing: {timeSlicing: {resources: [{name: gpu, replicas: 3}]}}",
        one_resource("{name: nvidia.com/gpu, replicas: 3, devices: 2}"),
        one_resource("{name: nvidia.com/gpu, replicas: 3, devices: [0, '1', '1:0']}"),
        one_resource("{name: nvidia.com/gpu, replicas: 3, rename: mine}"),
    ],
)
def test_what_the_plugin_ignores_still_shares_every_gpu(kube, core, config_yaml):
    node = shared("gpu-a", kube, core, "odd", {"odd": config_yaml})

    assert mig_resources(node) == {"nvidia.com/gpu": "24"}
    assert gpu_labels(node)["nvidia.com/gpu.product"] == "NVIDIA-H200-SHARED"


@pytest.mark.parametrize(
    "config_yaml",
    [
        "version: v1\n",
        "version: v1\nsharing: {}\n",
        "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/mig-1g.18gb, replicas: 2}]}}",
    ],
)
def test_a_config_that_does_not_share_full_gpus_is_no_sharing(kube, core, config_yaml):
    node = shared("gpu-a", kube, core, "plain", {"plain": config_yaml})

    assert mig_resources(node) == {"nvidia.com/gpu": "8"}
    assert gpu_labels(node) == UNSHARED_LABELS


@pytest.mark.parametrize("default", [None, ""])
def test_without_a_config_the_node_goes_back_to_whole_gpus(kube, core, default):
    shared("gpu-a", kube, core, "sliced-4-as-gpu")

    node = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", default))

    assert mig_resources(node) == mig_resources(node, "capacity") == {"nvidia.com/gpu": "8"}
    assert gpu_labels(node) == UNSHARED_LABELS


def test_an_empty_label_where_there_was_none_is_no_change(kube, core):
    kube.add_gpu_node("gpu-a")
    write_device_plugin_config(core, CONFIGS)

    asked = ask_for_device_plugin_config(core, "gpu-a", "")
    time.sleep(10 * kube.mig_apply_seconds)

    assert core.read_node("gpu-a").metadata.resource_version == asked.metadata.resource_version


@pytest.mark.parametrize(
    "config_yaml",
    [
        one_resource("{name: nvidia.com/gpu, replicas: 1}"),
        one_resource("{name: nvidia.com/gpu}"),
        one_resource('{name: nvidia.com/gpu, replicas: "4"}'),
        one_resource("{replicas: 4}"),
        one_resource("{name: nvidia.com/gpu, replicas: 4, devices: 0}"),
        one_resource("{name: nvidia.com/gpu, replicas: 4, devices: some}"),
        one_resource("{name: NVIDIA.com/GPU, replicas: 4}"),
        one_resource("{name: nvidia.com/gpu, replicas: 4, rename: Not A Name}"),
        "version: v2\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}",
        "version: v1\nsharing: {timeSlicing: {resources: []}}",
        "version: v1\nsharing: {timeSlicing: {renameByDefault: true}}",
        "version: v1\nsharing: {timeSlicing: }",
        # The ignored block is validated all the same.
        "version: v1\nsharing: {timeSlicing: {resources: []}, mps: {resources: [{name: gpu, replicas: 2}]}}",
        "version: v1\nsharing: {timeSlicing: [not, a, mapping",
    ],
)
def test_a_config_the_plugin_cannot_read_takes_the_gpus_away_and_leaves_the_labels(kube, core, config_yaml):
    before = shared("gpu-a", kube, core, "sliced-4", {**CONFIGS, "bad": config_yaml})

    node = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "bad"))

    assert mig_resources(node) == mig_resources(node, "capacity") == {"nvidia.com/gpu": "0"}
    assert gpu_labels(node) == gpu_labels(before)


def test_a_missing_key_fails_and_a_good_one_recovers(kube, core):
    failing = shared("gpu-a", kube, core, "no-such-config")

    node = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "mps-2"))

    assert mig_resources(failing) == {"nvidia.com/gpu": "0"}
    assert gpu_labels(failing) == UNSHARED_LABELS
    assert mig_resources(node) == {"nvidia.com/gpu": "16"}


def test_without_the_config_map_any_config_fails(kube, core):
    kube.add_gpu_node("gpu-a")

    node = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "sliced-4"))

    assert mig_resources(node) == {"nvidia.com/gpu": "0"}
    assert gpu_labels(node) == UNSHARED_LABELS


def test_editing_the_config_map_changes_nothing_until_the_label_changes(kube, core):
    applied = shared("gpu-a", kube, core, "sliced-4-as-gpu")

    write_device_plugin_config(core, {**CONFIGS, "sliced-4-as-gpu": sharing_config(8)})
    time.sleep(10 * kube.mig_apply_seconds)
    unchanged = core.read_node("gpu-a")
    ask_for_device_plugin_config(core, "gpu-a", None)
    relabelled = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "sliced-4-as-gpu"))

    assert unchanged.metadata.resource_version == applied.metadata.resource_version
    assert mig_resources(unchanged) == {"nvidia.com/gpu": "32"}
    assert mig_resources(relabelled) == {"nvidia.com/gpu": "64"}


def test_a_stalled_plugin_changes_nothing_for_one_apply(kube, core):
    kube.add_gpu_node("gpu-a")
    write_device_plugin_config(core, CONFIGS)
    kube.set_device_plugin_outcome("gpu-a", "stall")

    asked = ask_for_device_plugin_config(core, "gpu-a", "sliced-4")
    time.sleep(10 * kube.mig_apply_seconds)
    stalled = core.read_node("gpu-a")
    retried = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "mps-2"))

    assert stalled.metadata.resource_version == asked.metadata.resource_version
    assert mig_resources(stalled) == {"nvidia.com/gpu": "8"}
    assert gpu_labels(stalled) == UNSHARED_LABELS
    assert mig_resources(retried) == {"nvidia.com/gpu": "16"}


def test_a_forced_failure_takes_the_gpus_away_for_the_applies_asked(kube, core):
    kube.add_gpu_node("gpu-a")
    write_device_plugin_config(core, CONFIGS)
    kube.set_device_plugin_outcome("gpu-a", "failed", applies=2)

    first = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "sliced-4"))
    second = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "mps-2"))
    third = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "sliced-4"))

    assert mig_resources(first) == mig_resources(second) == {"nvidia.com/gpu": "0"}
    assert gpu_labels(first) == gpu_labels(second) == UNSHARED_LABELS
    assert mig_resources(third) == {"nvidia.com/gpu.shared": "32"}


def test_unknown_outcomes_are_refused(kube):
    with pytest.raises(ValueError, match="outcome"):
        kube.set_device_plugin_outcome("gpu-a", "wedge")


def test_the_old_resources_show_until_the_plugin_applies(tmp_path):
    with KubeApiServer(mig_apply_seconds=0.3) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_device_plugin_config(core, CONFIGS)

        asked_at = time.monotonic()
        answer = ask_for_device_plugin_config(core, "gpu-a", "sliced-4-as-gpu")
        right_after = core.read_node("gpu-a")
        applied = wait_for_write(core, answer)
        applied_at = time.monotonic()

    assert mig_resources(answer) == mig_resources(right_after) == {"nvidia.com/gpu": "8"}
    assert gpu_labels(right_after) == UNSHARED_LABELS
    assert applied_at - asked_at >= server.mig_apply_seconds
    assert mig_resources(applied) == {"nvidia.com/gpu": "32"}


def test_a_newer_label_supersedes_a_pending_one(tmp_path):
    with KubeApiServer(mig_apply_seconds=0.3) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_device_plugin_config(core, CONFIGS)

        ask_for_device_plugin_config(core, "gpu-a", "sliced-4")
        time.sleep(0.2)
        asked_at = time.monotonic()
        node = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "mps-2"))
        applied_at = time.monotonic()

    assert applied_at - asked_at >= server.mig_apply_seconds
    assert mig_resources(node) == {"nvidia.com/gpu": "16"}


def test_a_stopped_server_applies_nothing_pending(tmp_path):
    with KubeApiServer(mig_apply_seconds=0.2) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_device_plugin_config(core, CONFIGS)
        asked = ask_for_device_plugin_config(core, "gpu-a", "sliced-4")
    time.sleep(0.4)

    node = server.get("Node", "gpu-a")
    assert node["metadata"]["resourceVersion"] == asked.metadata.resource_version
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_the_config_map_namespace_exists_from_the_start():
    server = KubeApiServer(device_plugin_config_map="gpu-sharing/plugin-configs")

    assert server.get("Namespace", "gpu-sharing") is not None
    assert server.get("Namespace", "gpu-operator") is not None


# --- agreement with the MIG manager ---------------------------------------------------------------------


def test_a_mig_repartition_keeps_the_sharing_of_the_gpus_left_whole(kube, core):
    shared("gpu-a", kube, core, "sliced-4")
    write_mig_config(core)

    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    mixed = wait_for_state(core, "gpu-a", {"success"})
    ask_for_mig_config(core, "gpu-a", "all-disabled")
    whole = wait_for_state(core, "gpu-a", {"success"})

    assert (
        mig_resources(mixed)
        == mig_resources(mixed, "capacity")
        == {
            "nvidia.com/gpu.shared": "16",
            **VISION_MIXED_MIG,
        }
    )
    assert gpu_labels(mixed)["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert mig_resources(whole) == {"nvidia.com/gpu.shared": "32"}


def test_a_sharing_change_keeps_the_mig_devices(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    partitioned = wait_for_state(core, "gpu-a", {"success"})
    write_device_plugin_config(core, CONFIGS)

    node = wait_for_write(core, ask_for_device_plugin_config(core, "gpu-a", "sliced-4-as-gpu"))

    assert mig_resources(partitioned) == {"nvidia.com/gpu": "4", **VISION_MIXED_MIG}
    assert mig_resources(node) == mig_resources(node, "capacity")
    assert mig_resources(node) == {"nvidia.com/gpu": "16", **VISION_MIXED_MIG}
    assert mig_count_labels(node) == mig_count_labels(partitioned)


def test_a_failing_plugin_advertises_no_whole_gpus_after_a_repartition(kube, core):
    shared("gpu-a", kube, core, "no-such-config")
    write_mig_config(core)

    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert mig_resources(node) == {"nvidia.com/gpu": "0", **VISION_MIXED_MIG}


def test_a_mig_wedge_on_a_shared_node_advertises_nothing(kube, core):
    shared("gpu-a", kube, core, "sliced-4")
    write_mig_config(core, MIG_PARTED_YAML)
    kube.set_mig_outcome("gpu-a", "wedge")

    node = wait_for_write(core, ask_for_mig_config(core, "gpu-a", "every-gpu-halved"))

    assert mig_resources(node) == mig_resources(node, "capacity") == {"nvidia.com/gpu": "0"}
