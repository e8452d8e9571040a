"""MIG layouts: each layout rule (on the real catalogue, and alone on made-up models), placing profiles on a
GPU, and the free, used, placeable and stranded slices of a layout; the rules hold as properties of any
layout (hypothesis)."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pools.mig import (
    GpuModel,
    Instance,
    LayoutError,
    Profile,
    UnknownProfile,
    free_memory_slices,
    gpu_model,
    layout_errors,
    place_profiles,
    placeable_compute_slices,
    stranded_compute_slices,
    used_compute_slices,
    validate_layout,
)
from tests.pools.test_mig import CANDIDATES, MODELS, ROW, ROWS, compute_of, layout

# --- layout rules ---------------------------------------------------------------------------------------

VALID_LAYOUTS = {
    "seven 1g": [("1g", start) for start in range(7)],
    "1g+me and six 1g": [("1g+me", 0)] + [("1g", start) for start in range(1, 7)],
    "3g and 3g": [("3g", 0), ("3g", 4)],
    "4g and 3g": [("4g", 0), ("3g", 4)],
    "three 2g and a 1g at 6": [("2g", 0), ("2g", 2), ("2g", 4), ("1g", 6)],
    "one 7g": [("7g", 0)],
    "four 1g of 2 memory slices": [("1g (2 mem)", start) for start in (0, 2, 4, 6)],
    "empty": [],
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", VALID_LAYOUTS)
def test_valid_layouts_are_accepted(model, case):
    instances = layout(model, VALID_LAYOUTS[case])
    assert layout_errors(gpu_model(model), instances) == []
    validate_layout(gpu_model(model), instances)


# each case breaks one rule: (layout, words the one error must contain)
BROKEN_LAYOUTS = {
    "overlap": ([("2g", 0), ("1g", 1)], ["overlap", "slice 1"]),
    "bad start": ([("3g", 2)], ["start", "0, 4"]),
    "two +me": ([("1g+me", 0), ("1g+me", 1)], ["media-extension", "only one"]),
    "4g off 0": ([("4g", 4)], ["start only at memory slice 0"]),
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", BROKEN_LAYOUTS)
def test_each_broken_rule_gives_exactly_one_clear_error(model, case):
    spec, words = BROKEN_LAYOUTS[case]
    instances = layout(model, spec)
    errors = layout_errors(gpu_model(model), instances)
    assert len(errors) == 1, errors
    assert all(word in errors[0] for word in words), errors[0]
    assert all(str(instance) in errors[0] for instance in instances), errors[0]


def test_an_unknown_profile_in_a_layout_gives_one_error_naming_it():
    errors = layout_errors(gpu_model("H100-80GB"), [Instance(0, "1g.10gb"), Instance(1, "1g.18gb")])
    assert len(errors) == 1, errors
    assert "'1g.18gb'" in errors[0] and "H100-80GB" in errors[0]


# Within the real catalogue the starts already keep counts, compute and instances in bounds, so these rules
# can only be broken alone on a made-up model whose starts allow more.
ANYWHERE = tuple(range(8))
CAPPED = Profile("capped", 1, 1, 2, ANYWHERE, None, False)
HEAVY = Profile("heavy", 1, 2, 8, ANYWHERE, None, False)
LIGHT = Profile("light", 1, 0, 8, ANYWHERE, None, False)
EDGE = Profile("edge", 2, 1, 1, (7,), None, False)
A_ME = Profile("a+me", 1, 1, 1, ANYWHERE, None, True)
B_ME = Profile("b+me", 1, 1, 1, ANYWHERE, None, True)


def toy_model(*profiles: Profile) -> GpuModel:
    return GpuModel(name="toy", memory_gb=8, profiles={profile.name: profile for profile in profiles})


TOY = toy_model(CAPPED, HEAVY, LIGHT, EDGE, A_ME, B_ME)
TOY_BROKEN = {
    "over max count": ([Instance(s, "capped") for s in (0, 1, 2)], ["3 instances of capped", "at most 2"]),
    "compute over 7": ([Instance(s, "heavy") for s in range(4)], ["8 compute slices", "has 7"]),
    "eight instances": ([Instance(s, "light") for s in range(8)], ["8 instances", "at most 7"]),
    "past slice 7": ([Instance(7, "edge")], ["slices 7 to 8", "0 to 7"]),
    "two different +me": ([Instance(0, "a+me"), Instance(1, "b+me")], ["2 media-extension", "a+me at 0"]),
}


@pytest.mark.parametrize("case", TOY_BROKEN)
def test_each_rule_alone_on_a_made_up_model(case):
    instances, words = TOY_BROKEN[case]
    errors = layout_errors(TOY, instances)
    assert len(errors) == 1, errors
    assert all(word in errors[0] for word in words), errors[0]


@pytest.mark.parametrize(
    ("profiles", "placeable"),
    [((CAPPED,), 2), ((HEAVY,), 6), ((A_ME, B_ME), 1), ((LIGHT,), 0), ((EDGE,), 0), ((CAPPED, HEAVY), 7)],
)
def test_placeable_on_made_up_models_keeps_every_rule(profiles, placeable):
    assert placeable_compute_slices(toy_model(*profiles), []) == placeable


def test_placeable_counts_no_instance_past_the_seventh():
    seven_without_compute = [Instance(start, "light") for start in range(7)]
    assert placeable_compute_slices(toy_model(LIGHT, CAPPED), seven_without_compute) == 0


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({"capped": 3}, None),
        ({"heavy": 4}, None),
        ({"a+me": 1, "b+me": 1}, None),
        ({"light": 8}, None),
        ({"edge": 1}, None),
        ({"capped": 1, "heavy": 3}, [(0, "heavy"), (1, "heavy"), (2, "heavy"), (3, "capped")]),
        ({"light": 6, "a+me": 1}, [(0, "a+me"), *((s, "light") for s in range(1, 7))]),
    ],
)
def test_place_profiles_on_a_made_up_model_keeps_every_rule(counts, expected):
    placed = place_profiles(TOY, counts)
    assert placed == (None if expected is None else [Instance(start, name) for start, name in expected])


@pytest.mark.parametrize(
    ("instances", "words"),
    [
        ([Instance(s, "1g.10gb") for s in (*range(7), 0)], "8 instances"),
        ([Instance(0, "3g.40gb"), Instance(4, "3g.40gb"), Instance(0, "3g.40gb")], "at most 2"),
        (
            [Instance(0, "4g.40gb"), Instance(4, "2g.20gb"), Instance(6, "1g.10gb"), Instance(6, "1g.10gb")],
            "8 compute",
        ),
        ([Instance(6, "3g.40gb")], "slices 6 to 9"),
    ],
)
def test_real_layouts_breaking_several_rules_name_each(instances, words):
    errors = layout_errors(gpu_model("H100-80GB"), instances)
    assert len(errors) > 1
    assert any(words in error for error in errors), errors


def test_validate_layout_raises_with_every_error_in_its_message():
    instances = [Instance(2, "3g.40gb"), Instance(3, "1g.10gb")]
    errors = layout_errors(gpu_model("H100-80GB"), instances)
    with pytest.raises(LayoutError) as refused:
        validate_layout(gpu_model("H100-80GB"), instances)
    assert isinstance(refused.value, ValueError)
    assert len(errors) == 2
    assert all(error in str(refused.value) for error in errors)


# --- placement ------------------------------------------------------------------------------------------

H100 = gpu_model("H100-80GB")


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({}, []),
        ({"7g.80gb": 1}, [(0, "7g.80gb")]),
        ({"4g.40gb": 1, "3g.40gb": 1}, [(0, "4g.40gb"), (4, "3g.40gb")]),
        ({"1g.20gb": 4}, [(0, "1g.20gb"), (2, "1g.20gb"), (4, "1g.20gb"), (6, "1g.20gb")]),
        ({"1g.10gb": 1, "2g.20gb": 3}, [(0, "2g.20gb"), (2, "2g.20gb"), (4, "2g.20gb"), (6, "1g.10gb")]),
        # the 3g first tries 0 and must move to 4 to leave room for four 1g
        (
            {"3g.40gb": 1, "1g.10gb": 4},
            [(0, "1g.10gb"), (1, "1g.10gb"), (2, "1g.10gb"), (3, "1g.10gb"), (4, "3g.40gb")],
        ),
        # the 3g at 0 leaves the 2g only 4 and the 1g nowhere past 6
        (
            {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
            [(0, "2g.20gb"), (2, "1g.10gb"), (3, "1g.10gb"), (4, "3g.40gb")],
        ),
        ({"1g.20gb": 1, "1g.10gb": 6}, [*((s, "1g.10gb") for s in range(6)), (6, "1g.20gb")]),
        ({"1g.10gb": 0, "2g.20gb": 1}, [(0, "2g.20gb")]),
    ],
)
def test_place_profiles_larger_first_at_the_lowest_start_that_leaves_room(counts, expected):
    assert place_profiles(H100, counts) == [Instance(start, profile) for start, profile in expected]


@pytest.mark.parametrize(
    "counts",
    [
        {"4g.40gb": 2},
        {"7g.80gb": 1, "1g.10gb": 1},
        {"1g.10gb": 8},
        {"1g.10gb+me": 2},
        {"3g.40gb": 3},
        {"2g.20gb": 4},
        {"1g.20gb": 5},
        {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2},
        {"1g.10gb": 10**12},
    ],
)
def test_place_profiles_refuses_what_no_gpu_can_hold(counts):
    assert place_profiles(H100, counts) is None


def test_place_profiles_refuses_unknown_profiles_and_negative_counts():
    with pytest.raises(UnknownProfile):
        place_profiles(H100, {"1g.18gb": 1})
    with pytest.raises(ValueError, match="negative"):
        place_profiles(H100, {"1g.10gb": -1})


@st.composite
def valid_layouts(draw) -> tuple[GpuModel, list[Instance]]:
    """A model and a valid layout on it, grown by random allowed additions; those that break a rule are
    skipped."""
    model = draw(st.sampled_from(MODELS))
    instances: list[Instance] = []
    for candidate in draw(st.lists(st.sampled_from(CANDIDATES[model]), max_size=12)):
        if not layout_errors(gpu_model(model), [*instances, candidate]):
            instances.append(candidate)
    return gpu_model(model), instances


@st.composite
def any_layouts(draw) -> tuple[GpuModel, list[Instance]]:
    model = draw(st.sampled_from(MODELS))
    names = [row.name for row in ROWS if row.model == model] + ["9g.99gb"]
    instances = draw(st.lists(st.builds(Instance, st.integers(-1, 8), st.sampled_from(names)), max_size=9))
    return gpu_model(model), instances


@given(valid_layouts())
@settings(deadline=None)
def test_place_profiles_places_every_multiset_some_valid_layout_holds(case):
    model, instances = case
    counts = Counter(instance.profile for instance in instances)
    placed = place_profiles(model, counts)
    assert placed is not None, instances
    assert layout_errors(model, placed) == []
    assert Counter(instance.profile for instance in placed) == counts
    assert placed == sorted(placed)


@given(st.sampled_from(MODELS), st.data())
@settings(deadline=None)
def test_place_profiles_output_always_validates_and_ignores_the_order_of_counts(model, data):
    names = [row.name for row in ROWS if row.model == model]
    counts = data.draw(st.dictionaries(st.sampled_from(names), st.integers(0, 4), max_size=4))
    placed = place_profiles(gpu_model(model), counts)
    assert place_profiles(gpu_model(model), dict(reversed(counts.items()))) == placed
    if placed is not None:
        assert layout_errors(gpu_model(model), placed) == []
        assert Counter(instance.profile for instance in placed) == +Counter(counts)


# --- free, used, placeable and stranded slices ----------------------------------------------------------

# (layout, placeable compute slices, stranded compute slices), the same on every model
STRANDED = {
    "empty": ([], 7, 0),
    "four 1g of 2 memory slices": ([("1g (2 mem)", s) for s in (0, 2, 4, 6)], 0, 3),
    "3g and 3g": ([("3g", 0), ("3g", 4)], 0, 1),
    "seven 1g": ([("1g", s) for s in range(7)], 0, 0),
    "1g+me and six 1g": ([("1g+me", 0)] + [("1g", s) for s in range(1, 7)], 0, 0),
    "one 7g": ([("7g", 0)], 0, 0),
    "4g alone": ([("4g", 0)], 3, 0),
    # slices 2-7 hold at most 5 compute: reaching slice 7 costs a 3g or a 2-slice 1g
    "a 2-slice 1g at 0": ([("1g (2 mem)", 0)], 5, 1),
    # 2g at 0 and 2, 1g at 5 and a 2-slice 1g at 6 use all six free compute slices
    "a 1g at 4": ([("1g", 4)], 6, 0),
    "3g at 0 and a 1g at 4": ([("3g", 0), ("1g", 4)], 2, 1),
    "three 2g": ([("2g", 0), ("2g", 2), ("2g", 4)], 1, 0),
}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("case", STRANDED)
def test_placeable_and_stranded_compute_slices(model, case):
    spec, placeable, stranded = STRANDED[case]
    instances = layout(model, spec)
    assert placeable_compute_slices(gpu_model(model), instances) == placeable
    assert stranded_compute_slices(gpu_model(model), iter(instances)) == stranded


@pytest.mark.parametrize(
    ("spec", "free", "used"),
    [
        ([], set(range(8)), 0),
        ([("3g", 4)], {0, 1, 2, 3}, 3),
        ([("1g", s) for s in range(7)], {7}, 7),
        ([("4g", 0), ("3g", 4)], set(), 7),
        ([("1g (2 mem)", s) for s in (0, 2, 4, 6)], set(), 4),
        ([("2g", 2), ("1g+me", 5)], {0, 1, 4, 6, 7}, 3),
    ],
)
def test_free_memory_slices_and_used_compute_slices(spec, free, used):
    instances = layout("H200-141GB", spec)
    assert free_memory_slices(gpu_model("H200-141GB"), instances) == free
    assert used_compute_slices(gpu_model("H200-141GB"), instances) == used


def test_placeable_and_stranded_refuse_an_impossible_layout():
    overlapping = [Instance(0, "4g.40gb"), Instance(2, "2g.20gb")]
    with pytest.raises(LayoutError):
        placeable_compute_slices(H100, overlapping)
    with pytest.raises(LayoutError):
        stranded_compute_slices(H100, overlapping)


@given(valid_layouts())
@settings(deadline=None)
def test_stranded_slices_are_a_part_of_the_free_ones(case):
    model, instances = case
    used = used_compute_slices(model, instances)
    assert used == compute_of(model.name, instances)
    placeable = placeable_compute_slices(model, instances)
    stranded = stranded_compute_slices(model, instances)
    assert 0 <= stranded <= 7 - used
    assert placeable + used <= 7
    assert stranded == 7 - used - placeable


@given(valid_layouts())
@settings(deadline=None)
def test_free_memory_slices_are_those_no_instance_covers(case):
    model, instances = case
    covered = [
        s for i in instances for s in range(i.start, i.start + ROW[(model.name, i.profile)].memory_slices)
    ]
    assert free_memory_slices(model, instances) == set(range(8)) - set(covered)
    assert len(free_memory_slices(model, instances)) == 8 - len(covered)


@given(valid_layouts())
@settings(deadline=None)
def test_placeable_is_the_best_first_addition_plus_what_it_leaves(case):
    """Any valid addition never raises what can still be placed, and the best one accounts for all of it:
    together with 0 when nothing fits, this pins placeable down whatever search computes it."""
    model, instances = case
    placeable = placeable_compute_slices(model, instances)
    additions = [c for c in CANDIDATES[model.name] if not layout_errors(model, [*instances, c])]
    after = {c: placeable_compute_slices(model, [*instances, c]) for c in additions}
    assert all(after[c] <= placeable for c in additions)
    assert placeable == max((compute_of(model.name, [c]) + after[c] for c in additions), default=0)


@given(any_layouts())
@settings(deadline=None)
def test_layout_errors_is_empty_exactly_when_validate_layout_accepts(case):
    model, instances = case
    errors = layout_errors(model, instances)
    try:
        validate_layout(model, instances)
    except LayoutError as refused:
        assert errors
        assert all(error in str(refused) for error in errors)
    else:
        assert errors == []
