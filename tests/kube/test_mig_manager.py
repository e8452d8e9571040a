"""The test API server's emulation of NVIDIA's MIG manager, driven only through the official client: a
node's MIG config label is applied to its advertised resources, count labels and layout, or fails."""

from __future__ import annotations

import json
import time

import pytest

from tests.kube.client import (
    LAYOUT,
    MIG_PARTED_YAML,
    STATE,
    ask_for_mig_config,
    connect,
    mig_count_labels,
    mig_resources,
    wait_for_state,
    write_mig_config,
)
from tests.kube.server import KubeApiServer


def test_a_per_gpu_config_is_applied_to_capacity_labels_and_layout(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)

    answer = ask_for_mig_config(core, "gpu-a", "vision-mixed")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert answer.metadata.labels[STATE] == "pending"
    expected = {
        "nvidia.com/gpu": "4",
        "nvidia.com/mig-1g.18gb": "14",
        "nvidia.com/mig-3g.71gb": "3",
        "nvidia.com/mig-1g.18gb.me": "1",
        "nvidia.com/mig-2g.35gb": "1",
    }
    assert mig_resources(node, "allocatable") == mig_resources(node, "capacity") == expected
    assert mig_count_labels(node) == {
        "nvidia.com/mig-1g.18gb.count": "14",
        "nvidia.com/mig-3g.71gb.count": "3",
        "nvidia.com/mig-1g.18gb.me.count": "1",
        "nvidia.com/mig-2g.35gb.count": "1",
    }
    layout = json.loads(node.metadata.annotations[LAYOUT])
    assert layout[:4] == [
        {"mig": True, "devices": {"1g.18gb": 7}},
        {"mig": True, "devices": {"1g.18gb": 7}},
        {"mig": True, "devices": {"3g.71gb": 2}},
        {"mig": True, "devices": {"1g.18gb+me": 1, "2g.35gb": 1, "3g.71gb": 1}},
    ]
    assert layout[4:] == [{"mig": False, "devices": {}}] * 4


def test_gpus_a_config_does_not_name_keep_their_layout(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    wait_for_state(core, "gpu-a", {"success"})

    ask_for_mig_config(core, "gpu-a", "first-gpu-whole-slice")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert mig_resources(node) == {
        "nvidia.com/gpu": "4",
        "nvidia.com/mig-7g.141gb": "1",
        "nvidia.com/mig-1g.18gb": "7",
        "nvidia.com/mig-3g.71gb": "3",
        "nvidia.com/mig-1g.18gb.me": "1",
        "nvidia.com/mig-2g.35gb": "1",
    }


def test_all_disabled_restores_full_gpus(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    halved = wait_for_state(core, "gpu-a", {"success"})

    ask_for_mig_config(core, "gpu-a", "all-disabled")
    node = wait_for_state(core, "gpu-a", {"success"})

    assert mig_resources(halved) == {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.71gb": "16"}
    assert mig_resources(node, "capacity") == mig_resources(node) == {"nvidia.com/gpu": "8"}
    assert mig_count_labels(node) == {}
    assert json.loads(node.metadata.annotations[LAYOUT]) == [{"mig": False, "devices": {}}] * 8


def test_the_previous_success_lingers_before_pending(tmp_path):
    with KubeApiServer(stale_success_seconds=0.4, mig_apply_seconds=0.2) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_mig_config(core)

        answer = ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
        right_after = core.read_node("gpu-a")
        seen = wait_for_state(core, "gpu-a", {"pending", "failed"})
        done = wait_for_state(core, "gpu-a", {"success"})

    assert answer.metadata.labels[STATE] == right_after.metadata.labels[STATE] == "success"
    assert mig_resources(right_after) == {
        "nvidia.com/gpu": "8"
    }  # the old config's success, not the new one's
    assert seen.metadata.labels[STATE] == "pending"
    assert mig_resources(done) == {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.71gb": "16"}


def test_a_forced_failure_leaves_capacity_and_lasts_one_apply(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    kube.set_mig_outcome("gpu-a", "failed")

    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    failed = wait_for_state(core, "gpu-a", {"success", "failed"})
    ask_for_mig_config(core, "gpu-a", "vision-mixed")
    retried = wait_for_state(core, "gpu-a", {"success", "failed"})

    assert failed.metadata.labels[STATE] == "failed"
    assert mig_resources(failed) == {"nvidia.com/gpu": "8"}
    assert retried.metadata.labels[STATE] == "success"


def test_a_wedged_node_stays_pending_with_nothing_advertised(kube, core):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core)
    kube.set_mig_outcome("gpu-a", "wedge")

    ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
    deadline = time.monotonic() + 5
    while core.read_node("gpu-a").status.allocatable["nvidia.com/gpu"] != "0":
        assert time.monotonic() < deadline, "the wedge never took the GPUs away"
        time.sleep(0.01)
    time.sleep(10 * kube.mig_apply_seconds)
    wedged = core.read_node("gpu-a")

    assert wedged.metadata.labels[STATE] == "pending"
    assert mig_resources(wedged) == mig_resources(wedged, "capacity") == {"nvidia.com/gpu": "0"}
    # The recovery path a provisioner takes: ask again, and this time the manager finishes.
    ask_for_mig_config(core, "gpu-a", "all-disabled")
    assert mig_resources(wait_for_state(core, "gpu-a", {"success"})) == {"nvidia.com/gpu": "8"}


def single_config(name: str, entry: str) -> str:
    return f"version: v1\nmig-configs:\n  {name}:\n    - {entry}\n"


@pytest.mark.parametrize(
    ("config_yaml", "config"),
    [
        (MIG_PARTED_YAML, "no-such-config"),
        ("version: v1\nmig-configs: [not, a, mapping", "broken"),
        (single_config("minus", '{devices: all, mig-enabled: true, mig-devices: {"1g.18gb": -1}}'), "minus"),
        (single_config("text", '{devices: all, mig-enabled: true, mig-devices: {"1g.18gb": "7"}}'), "text"),
        (single_config("odd", "{devices: some, mig-enabled: true}"), "odd"),
        (single_config("flag", '{devices: all, mig-enabled: "yes please"}'), "flag"),
    ],
)
def test_a_config_the_manager_cannot_apply_fails(kube, core, config_yaml, config):
    kube.add_gpu_node("gpu-a")
    write_mig_config(core, config_yaml)

    ask_for_mig_config(core, "gpu-a", config)
    node = wait_for_state(core, "gpu-a", {"success", "failed"})

    assert node.metadata.labels[STATE] == "failed"
    assert mig_resources(node, "capacity") == {"nvidia.com/gpu": "8"}


def test_all_disabled_is_known_without_a_config_map(kube, core):
    kube.add_gpu_node("gpu-a")
    ask_for_mig_config(core, "gpu-a", "something")
    assert wait_for_state(core, "gpu-a", {"success", "failed"}).metadata.labels[STATE] == "failed"

    ask_for_mig_config(core, "gpu-a", "all-disabled")

    assert mig_resources(wait_for_state(core, "gpu-a", {"success", "failed"})) == {"nvidia.com/gpu": "8"}


def test_gpus_without_mig_cannot_enable_it(kube, core):
    kube.add_gpu_node("a100-pcie", product="NVIDIA-A10", mig_capable=False)
    write_mig_config(core)

    ask_for_mig_config(core, "a100-pcie", "every-gpu-halved")

    assert wait_for_state(core, "a100-pcie", {"success", "failed"}).metadata.labels[STATE] == "failed"


def test_a_newer_change_restarts_the_apply(tmp_path):
    """The first change's timer must not finish the second change early."""
    with KubeApiServer(mig_apply_seconds=0.3) as server:
        core = connect(server, tmp_path)
        server.add_gpu_node("gpu-a")
        write_mig_config(core)

        ask_for_mig_config(core, "gpu-a", "every-gpu-halved")
        time.sleep(0.2)
        asked = time.monotonic()
        ask_for_mig_config(core, "gpu-a", "first-gpu-whole-slice")
        node = wait_for_state(core, "gpu-a", {"success", "failed"})
        finished = time.monotonic()

    assert finished - asked >= server.mig_apply_seconds
    assert mig_resources(node) == {"nvidia.com/gpu": "7", "nvidia.com/mig-7g.141gb": "1"}
