"""The MIG catalogue against the reference table, the device plugin's resource names and the node labels a
GPU model is read from; the reference rows here are shared by test_mig_layouts.py."""

from dataclasses import dataclass

import pytest

from pools.kinds import profile_of_resource, resource_name
from pools.mig import (
    FULL_GPU_RESOURCE,
    GPU_MODELS,
    Instance,
    UnknownGpuModel,
    UnknownProfile,
    gpu_model,
)

# Typed from the published profile tables (NVIDIA's MIG User Guide, "Supported MIG Profiles") and the
# placements `nvidia-smi mig -lgipp` lists, not from pools/mig.py, so that a typo in either shows.
# Columns: class, A100-40GB, A100-80GB and H100-80GB, H100-94GB (H100 NVL), GH200-96GB, H200-141GB,
# B200-180GB, GB200-186GB, memory slices, compute, max count, starts.
REFERENCE_TABLE = """
| 1g     | 1g.5gb | 1g.10gb | 1g.12gb | 1g.12gb | 1g.18gb | 1g.23gb | 1g.23gb | 1 | 1 | 7 | 0,1,2,3,4,5,6 |
| 1g+me  | 1g.5gb+me | 1g.10gb+me | 1g.12gb+me | 1g.12gb+me | 1g.18gb+me | 1g.23gb+me | 1g.23gb+me | 1 | 1 | 1 | 0,1,2,3,4,5,6 |
| 1g (2 mem) | 1g.10gb | 1g.20gb | 1g.24gb | 1g.24gb | 1g.35gb | 1g.45gb | 1g.47gb | 2 | 1 | 4 | 0,2,4,6 |
| 2g     | 2g.10gb | 2g.20gb | 2g.24gb | 2g.24gb | 2g.35gb | 2g.45gb | 2g.47gb | 2 | 2 | 3 | 0,2,4 |
| 3g     | 3g.20gb | 3g.40gb | 3g.47gb | 3g.48gb | 3g.71gb | 3g.90gb | 3g.93gb | 4 | 3 | 2 | 0,4 |
| 4g     | 4g.20gb | 4g.40gb | 4g.47gb | 4g.48gb | 4g.71gb | 4g.90gb | 4g.93gb | 4 | 4 | 1 | 0 |
| 7g     | 7g.40gb | 7g.80gb | 7g.94gb | 7g.96gb | 7g.141gb | 7g.180gb | 7g.186gb | 8 | 7 | 1 | 0 |
"""  # noqa: E501
TABLE_COLUMN = {
    "A100-40GB": 1,
    "A100-80GB": 2,
    "H100-80GB": 2,
    "H100-94GB": 3,
    "GH200-96GB": 4,
    "H200-141GB": 5,
    "B200-180GB": 6,
    "GB200-186GB": 7,
}
MODEL_MEMORY_GB = {
    "A100-40GB": 40,
    "A100-80GB": 80,
    "H100-80GB": 80,
    "H100-94GB": 94,
    "GH200-96GB": 96,
    "H200-141GB": 141,
    "B200-180GB": 180,
    "GB200-186GB": 186,
}
USABLE_GIB = {
    ("H100-80GB", "1g"): 9.75,
    ("H100-80GB", "2g"): 19.62,
    ("H100-80GB", "3g"): 39.50,
    ("H100-80GB", "4g"): 39.50,
    ("H100-80GB", "7g"): 79.25,
    ("H200-141GB", "1g"): 16.00,
    ("H200-141GB", "2g"): 32.50,
    ("H200-141GB", "7g"): 140.00,
}
MODELS = list(TABLE_COLUMN)


@dataclass(frozen=True)
class Row:
    model: str
    kind: str  # the reference's class column
    name: str
    memory_slices: int
    compute_slices: int
    max_count: int
    starts: tuple[int, ...]


def _reference_rows() -> list[Row]:
    rows = []
    for line in REFERENCE_TABLE.strip().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        for model, column in TABLE_COLUMN.items():
            starts = tuple(int(start) for start in cells[11].split(","))
            rows.append(
                Row(model, cells[0], cells[column], int(cells[8]), int(cells[9]), int(cells[10]), starts)
            )
    return rows


ROWS = _reference_rows()
ROW = {(row.model, row.name): row for row in ROWS}
NAME = {(row.model, row.kind): row.name for row in ROWS}
# Every instance the reference allows on an empty GPU of each model.
CANDIDATES = {
    model: [Instance(s, row.name) for row in ROWS if row.model == model for s in row.starts]
    for model in MODELS
}


def layout(model: str, spec: list[tuple[str, int]]) -> list[Instance]:
    """A layout written with the reference's classes, so that one spec serves every model."""
    return [Instance(start, NAME[(model, kind)]) for kind, start in spec]


def compute_of(model: str, instances: list[Instance]) -> int:
    return sum(ROW[(model, i.profile)].compute_slices for i in instances)


# --- the catalogue --------------------------------------------------------------------------------------


def test_the_catalogue_holds_the_reference_models_and_their_memory():
    assert {name: model.memory_gb for name, model in GPU_MODELS.items()} == MODEL_MEMORY_GB
    assert all(GPU_MODELS[name].name == name for name in MODELS)


@pytest.mark.parametrize("model", MODELS)
def test_each_model_has_the_reference_profiles_from_small_to_large(model):
    assert list(gpu_model(model).profiles) == [row.name for row in ROWS if row.model == model]


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row.model}:{row.name}")
def test_each_profile_matches_its_reference_row(row):
    profile = gpu_model(row.model).profile(row.name)
    assert profile.name == row.name
    assert profile.memory_slices == row.memory_slices
    assert profile.compute_slices == row.compute_slices
    assert profile.max_count == row.max_count
    assert profile.starts == row.starts
    assert profile.media_extension is (row.kind == "1g+me")
    assert profile.usable_memory_gib == USABLE_GIB.get((row.model, row.kind))


def test_the_a100_80gb_shares_names_with_the_h100_but_not_its_measured_memory():
    a100, h100 = gpu_model("A100-80GB"), gpu_model("H100-80GB")
    assert list(a100.profiles) == list(h100.profiles)
    assert [p.usable_memory_gib for p in a100.profiles.values()] == [None] * 7
    assert h100.profile("3g.40gb").usable_memory_gib == 39.50


@pytest.mark.parametrize("model", MODELS)
def test_every_allowed_start_keeps_the_instance_on_the_gpu(model):
    for profile in gpu_model(model).profiles.values():
        assert all(start >= 0 and start + profile.memory_slices <= 8 for start in profile.starts), profile


def test_an_unknown_model_is_refused_with_the_known_ones_listed():
    with pytest.raises(UnknownGpuModel) as refused:
        gpu_model("V100-32GB")
    assert isinstance(refused.value, ValueError)
    assert "V100-32GB" in str(refused.value)
    assert all(name in str(refused.value) for name in MODELS)


def test_an_unknown_profile_is_refused_by_the_model():
    with pytest.raises(UnknownProfile) as refused:
        gpu_model("H100-80GB").profile("1g.18gb")  # an H200 profile
    assert isinstance(refused.value, ValueError)
    assert "1g.18gb" in str(refused.value)
    assert "H100-80GB" in str(refused.value)


# --- device plugin resources ----------------------------------------------------------------------------

RESOURCES = [
    ("1g.18gb", "nvidia.com/mig-1g.18gb"),
    ("1g.18gb+me", "nvidia.com/mig-1g.18gb.me"),
    ("1g.5gb+me", "nvidia.com/mig-1g.5gb.me"),
    ("7g.141gb", "nvidia.com/mig-7g.141gb"),
    ("3g.40gb", "nvidia.com/mig-3g.40gb"),
    ("full", "nvidia.com/gpu"),
]


@pytest.mark.parametrize(("profile", "resource"), RESOURCES)
def test_resource_names_both_ways(profile, resource):
    assert resource_name(profile) == resource
    assert profile_of_resource(resource) == profile


def test_full_gpu_resource_is_the_plain_gpu():
    assert FULL_GPU_RESOURCE == "nvidia.com/gpu"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row.model}:{row.name}")
def test_every_catalogue_profile_round_trips_through_its_resource(row):
    profile = gpu_model(row.model).profile(row.name)
    expected = "nvidia.com/mig-" + row.name.replace("+me", ".me")
    assert profile.resource_name == expected
    assert profile_of_resource(expected) == row.name


@pytest.mark.parametrize(
    "resource",
    [
        "cpu",
        "memory",
        "nvidia.com/gpu.shared",
        "amd.com/gpu",
        "nvidia.com/mig-",
        "nvidia.com/mig-foo",
        "",
        "nvidia.com/mig-1g.10gb.me.x",
    ],
)
def test_other_resources_have_no_profile(resource):
    assert profile_of_resource(resource) is None
