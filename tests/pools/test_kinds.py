"""GPU kinds: every profile belongs to exactly one kind, whose answers agree with the MIG catalogue and the
device plugin's resources; spec ids round-trip through their kind; and the code outside the kinds asks a
kind instead of testing a profile's name."""

import re
from pathlib import Path

import pytest

from pools import kinds, mig
from pools.gpu_models import model_info
from pools.kinds import KINDS, MIG, MPS, SHARE_KINDS, TIME_SLICED, WHOLE, UnknownProfile, kind_named, kind_of
from pools.specs import UnknownSpec, parse_spec, specs_of

ROOT = Path(__file__).resolve().parents[2]
MODELS = [*mig.GPU_MODELS, "L40S-48GB", "T4-16GB"]


@pytest.mark.parametrize("model", MODELS)
def test_each_profile_of_a_model_belongs_to_exactly_one_kind(model):
    info = model_info(model)
    profiles = kinds.profiles_of(info)
    assert profiles[0] == WHOLE.profile
    assert len(profiles) == len(set(profiles))
    for profile in profiles:
        owners = [kind for kind in KINDS if kind.owns(profile)]
        assert owners == [kind_of(profile)]
        kind_of(profile).check(info, profile)
    mig_profiles = [profile for profile in profiles if kind_of(profile) is MIG]
    assert (info.mig is None) == (mig_profiles == [])
    assert [p for p in profiles if kind_of(p) is TIME_SLICED] == [f"ts-{n}" for n in range(8, 1, -1)]
    assert [p for p in profiles if kind_of(p) is MPS] == [f"mps-{n}" for n in range(8, 1, -1)]


@pytest.mark.parametrize("model", mig.GPU_MODELS)
def test_the_mig_kind_answers_what_the_catalogue_says(model):
    info = model_info(model)
    for name, profile in info.mig.profiles.items():
        assert kind_of(name) is MIG
        assert MIG.compute_slices(info, name) == profile.compute_slices
        assert MIG.max_per_gpu(info, name) == profile.max_count
        assert MIG.slots(info, name, profile.starts[-1]) == (
            profile.starts[-1],
            profile.starts[-1] + profile.memory_slices,
        )
        assert MIG.resource_name(name) == profile.resource_name
        assert not MIG.takes_whole_gpu and not MIG.gpu_figures


@pytest.mark.parametrize("model", MODELS)
def test_a_whole_gpu_is_all_of_it_on_any_model(model):
    info = model_info(model)
    assert kind_of("full") is WHOLE and WHOLE.takes_whole_gpu and WHOLE.gpu_figures
    assert WHOLE.compute_slices(info, "full") == mig.COMPUTE_SLICES
    assert WHOLE.memory_gb(info, "full") == info.memory_gb
    assert WHOLE.max_per_gpu(info, "full") == 1
    assert WHOLE.slots(info, "full", None) == (0, mig.MEMORY_SLICES)
    assert WHOLE.resource_name("full") == "nvidia.com/gpu"


@pytest.mark.parametrize("model", MODELS)
def test_every_spec_round_trips_through_its_kind_and_resource(model):
    for spec in specs_of([model]):
        assert parse_spec(spec.id) == spec
        assert spec.id == f"{model.lower()}.{spec.kind.token(spec.profile)}"
        assert spec.compute_slices == kinds.compute_slices(model, spec.profile)
        if spec.kind in SHARE_KINDS:  # one resource for every share mode: the node's mode tells them apart
            assert spec.resource_name == "nvidia.com/gpu.shared"
            assert kinds.profile_of_resource(spec.resource_name) is None
        else:
            assert kinds.profile_of_resource(spec.resource_name) == spec.profile


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("l40s-48gb.mig-1g.12gb", "L40S-48GB is offered as l40s-48gb.full, or in shares l40s-48gb.ts-N or"),
        ("l40s-48gb.ts-9", "l40s-48gb.mps-N (N from 2 to 8)"),
        ("l40s-48gb.ts-1", "(N from 2 to 8)"),
        ("h100-80gb.mig-1g.18gb", "H100-80GB is offered as h100-80gb.full, h100-80gb.mig-1g.10gb,"),
        ("h100-80gb.whole", "H100-80GB is offered as"),
        ("h100-80gb.1g.10gb", "H100-80GB is offered as"),
        ("H100-80GB.full", "specs look like"),
        ("h100-80gb", "specs look like"),
        ("x100.full", "specs look like"),
    ],
)
def test_a_spec_no_kind_offers_is_refused_saying_what_is(spec, message):
    with pytest.raises(UnknownSpec) as refused:
        parse_spec(spec)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    ("kind", "profile", "slices", "memory"), [(TIME_SLICED, "ts-4", 7 / 4, 48), (MPS, "mps-2", 3.5, 24)]
)
def test_a_share_is_its_fraction_of_the_gpu(kind, profile, slices, memory):
    info = model_info("L40S-48GB")
    assert kind_of(profile) is kind and not kind.takes_whole_gpu
    assert kind.gpu_figures and not kind.measured_alone  # its figures are the whole GPU's, shared
    assert not kind.own_device  # no claim can hold a shared GPU alone
    assert kind.compute_slices(info, profile) == slices
    assert (
        sum(kind.compute_slices(info, profile) for _ in range(kind.replicas(profile))) == mig.COMPUTE_SLICES
    )
    assert kind.memory_gb(info, profile) == memory
    assert kind.slots(info, profile, 0) == (0, 1)
    assert kind.offer_of(profile) == profile
    with pytest.raises(ValueError, match="one of shares 0 to"):
        kind.slots(info, profile, kind.replicas(profile))


def test_share_modes_come_from_feature_discovery_labels():
    assert kinds.share_profile("time-slicing", 4) == "ts-4"
    assert kinds.share_profile("mps", 2) == "mps-2"
    assert kinds.share_profile("none", 1) == kinds.share_profile("", 0) == ""
    for strategy, replicas in [("time-slicing", 9), ("mps", 16), ("fractional", 2)]:
        with pytest.raises(ValueError):
            kinds.share_profile(strategy, replicas)


@pytest.mark.parametrize(
    ("offers", "message"),
    [
        (["ts-1"], "2 to 8 ways"),
        (["ts-9"], "2 to 8 ways"),
        (["time-sliced"], "is no offer"),
        ([], "at least one"),
        ("whole", "a list"),
        (["mig", "mig"], "once"),
    ],
)
def test_a_group_offers_kinds_and_share_modes_the_device_plugin_allows(offers, message):
    with pytest.raises(ValueError, match=message):
        kinds.parse_offers(offers)
    assert kinds.parse_offers(["whole", "mig", "ts-4", "mps-2"]) == ("whole", "mig", "ts-4", "mps-2")


def test_profiles_and_kinds_no_kind_owns_are_refused():
    for profile in ["", "whole", "3g", "ts-1x", "ts-", "7g.80GB"]:
        with pytest.raises(UnknownProfile):
            kind_of(profile)
    with pytest.raises(UnknownProfile, match="kinds: whole, mig, time-sliced, mps"):
        kind_named("slices")
    assert kind_named("mig") is MIG
    assert kinds.counted_slices("L40S-48GB", "1g.10gb") == 0  # held once, counts for nothing now
    assert kinds.profile_of_resource("nvidia.com/gpu.shared") is None


def test_code_outside_the_kinds_asks_a_kind_rather_than_testing_a_profile_name():
    """The whole-GPU profile's name is the kinds' (and the MIG catalogue's, for its own geometry) alone."""
    allowed = {ROOT / "pools" / "mig.py", *(ROOT / "pools" / "kinds").glob("*.py")}
    found = []
    for app in ("pools", "monitoring", "billing", "portal"):
        for path in (ROOT / app).rglob("*.py"):
            if path in allowed or "migrations" in path.parts:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"FULL_GPU\b|[=!]= *[\"']full[\"']|[\"']full[\"'] *[=!]=", line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_whole_gpus_and_mig_instances_are_devices_a_claim_can_hold_alone():
    assert kind_of("full").own_device and kind_of("3g.71gb").own_device
