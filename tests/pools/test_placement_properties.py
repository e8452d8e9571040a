"""The placement engine's rules as properties of any fleet (hypothesis): every answer keeps every rule, a
request fits exactly when the capacity it sees holds it, and availability offers exactly what a request gets.
The rules by example are in test_placement.py."""

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pools.kinds import DEFAULT_OFFERS, compute_slices
from pools.mig import COMPUTE_SLICES, FULL_GPU, gpu_model, place_profiles
from pools.placement import (
    Fleet,
    Gpu,
    Item,
    Request,
    Slot,
    apply,
    fleet_index,
    place,
    place_all,
    shortfall,
    validate_request,
)
from pools.placement.availability import Availability, availability, emptied, obtainable_in
from pools.placement.index import FleetIndex
from pools.placement.plan import share_slots
from tests.examples import examples
from tests.pools.test_placement import (
    A100,
    H100,
    H200,
    ask,
    check_placement,
    fleet,
    gpu,
    has_allocation,
    index_summary,
)

# Mostly one model, one cluster, no group, so that most requests find room; the rest is there to be hit.
MODELS = [H100, H100, A100]
SHARES = ["ts-2", "mps-4"]
# What group "g" offers, drawn once per fleet; GPUs out of any group offer whole GPUs and MIG.
OFFERS = [DEFAULT_OFFERS, (*DEFAULT_OFFERS, "ts-2"), ("whole", "ts-2", "mps-4"), ("mig", "mps-4")]
# Profiles of a model by position in the catalogue, common ones more often, so free instances match.
PROFILES = [0, 0, 2, 3, 3, 4, 5, 6, 1]


def profile_at(model: str, position: int) -> str:
    return list(gpu_model(model).profiles)[position]


@st.composite
def gpus_(draw, shares: bool = True) -> Fleet:
    """A fleet; without `shares`, of whole GPUs and MIG only, every group offering both."""
    gpus = []
    offers = draw(st.sampled_from(OFFERS)) if shares else DEFAULT_OFFERS
    for n in range(draw(st.integers(1, 8))):
        if n % 2 == 0:  # a node of two GPUs shares its cluster, group and share mode
            group = draw(st.sampled_from([None, None, "g"]))
            node = dict(
                node=f"n{n // 2}",
                cluster=draw(st.sampled_from(["", "", "", "b"])),
                group=group,
                offers=offers if group else DEFAULT_OFFERS,
                sharing=draw(st.sampled_from(["", "", *SHARES])) if shares else "",
            )
        model = draw(st.sampled_from(MODELS))
        fields = dict(
            **node, schedulable=draw(st.integers(0, 9)) > 0, reconfiguring=draw(st.integers(0, 4)) == 0
        )
        if draw(st.integers(0, 2)) == 0 and node["sharing"]:  # MIG off on a shared node: shared
            shares = tuple(
                Slot(profile, start, draw(st.booleans())) for profile, start in share_slots(node["sharing"])
            )
            gpus.append(Gpu(f"g{n}", model=model, mig=False, instances=shares, **fields))
            continue
        if draw(st.integers(0, 2)) == 0 and not node["sharing"]:
            gpus.append(Gpu(f"g{n}", model=model, mig=False, allocated=draw(st.booleans()), **fields))
            continue
        profiles = draw(st.lists(st.sampled_from(PROFILES), max_size=6))
        instances = place_profiles(gpu_model(model), Counter(profile_at(model, p) for p in profiles)) or []
        slots = tuple(Slot(i.profile, i.start, draw(st.booleans())) for i in instances)
        gpus.append(Gpu(f"g{n}", model=model, mig=True, instances=slots, **fields))
    return Fleet(tuple(gpus))


@st.composite
def requests_(draw, id: str = "r", shares: bool = True) -> Request:
    items = []
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        model = draw(st.sampled_from(MODELS))
        position = draw(st.sampled_from([None, None, *PROFILES, *(SHARES if shares else ())]))
        profile = (
            FULL_GPU if position is None else position if position in SHARES else profile_at(model, position)
        )
        items.append(Item(model, profile, draw(st.sampled_from([1, 1, 1, 2, 3, 5]))))
    return Request(id, tuple(items), draw(st.sampled_from([None, None, None, "g"])))


def eligible(f: Fleet, request: Request, cluster: str, model: str) -> list[Gpu]:
    return [
        g
        for g in f.gpus
        if g.cluster == cluster and g.model == model and g.schedulable and request.group in (None, g.group)
    ]


PROPERTY = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(gpus_(), requests_(), st.lists(requests_(id="q"), max_size=3))
def test_every_answer_keeps_every_rule(f, request, upcoming):
    check_placement(f, request, place(f, request, upcoming=upcoming))


@PROPERTY
@given(gpus_(), st.lists(requests_(), min_size=1, max_size=6))
def test_place_all_assigns_no_instance_or_gpu_twice(f, requests):
    requests = [replace(r, id=f"r{n}") for n, r in enumerate(requests)]
    placements, final = place_all(f, requests)
    current, given_out = f, []
    for request, placement in zip(requests, placements, strict=True):
        current = check_placement(current, request, placement)
        given_out += [(a.gpu, a.start) for a in placement.assignments]
    assert len(given_out) == len(set(given_out))
    assert final == current
    assert index_summary(fleet_index(final)) == index_summary(
        FleetIndex.build(final.gpus)
    )  # the changes made in place kept it right


@PROPERTY
@given(gpus_(), requests_())
def test_a_single_item_fits_exactly_when_the_capacity_it_sees_holds_it(f, request):
    """Free instances, then wholly free GPUs cut at most per GPU: the engine finds room exactly when a
    count made straight from the fleet says there is, and then uses free instances before re-cutting. (Without
    shares: availability's property below holds those to the engine.)"""
    item = request.items[0]
    if item.profile in SHARES:
        return
    f = Fleet(
        tuple(
            replace(g, sharing="", offers=DEFAULT_OFFERS, instances=g.instances if g.mig else ())
            for g in f.gpus
        )
    )
    request = replace(request, items=(item,))
    result = place(f, request)
    fits, free_enough = False, False
    for cluster in {g.cluster for g in f.gpus}:
        gpus = eligible(f, request, cluster, item.model)
        blank = [g for g in gpus if not has_allocation(g)]
        if item.profile == FULL_GPU:
            fits |= len(blank) >= item.count
            continue
        in_use = [s for g in gpus if g.mig and has_allocation(g) for s in g.instances]
        free = sum(s.profile == item.profile and not s.allocated for s in in_use)
        most = gpu_model(item.model).profile(item.profile).max_count  # on an empty GPU (MIG User Guide)
        fits |= free + len(blank) * most >= item.count
        free_enough |= free >= item.count
    assert result.placed == fits, result.reason
    if free_enough:
        assert result.reconfigure == ()


@PROPERTY
@given(gpus_(), requests_())
def test_an_unplaced_request_changes_nothing(f, request):
    result = place(f, request)
    if not result.placed:
        assert apply(f, result) is f and result.reason


@PROPERTY
@given(gpus_(), requests_())
def test_the_shortfall_is_nothing_where_a_request_fits_and_all_of_it_where_nothing_does(f, request):
    """The shortfall ranks clusters by how close they come: never above zero for one that takes the
    request, and the whole request's compute slices on a fleet without its GPUs."""
    if place(f, request).placed:
        assert shortfall(f, request) == 0
    elif validate_request(request, f):
        return
    empty = Fleet(tuple(g for g in f.gpus if g.model not in {i.model for i in request.items}))
    whole = sum(i.count * compute_slices(i.model, i.profile) for i in request.items)
    if not validate_request(request, empty):
        assert shortfall(empty, request) == whole
    assert shortfall(f, request) <= whole


def test_the_shortfall_counts_what_the_closest_cluster_lacks():
    f = fleet(
        *[gpu(f"a{n}", off=True, cluster="a", node="na") for n in range(2)],
        *[gpu(f"b{n}", off=True, busy=n < 6, model=H200, cluster="b", node="nb") for n in range(8)],
    )
    assert shortfall(f, ask((4, "full", H200))) == 2 * COMPUTE_SLICES  # b has 2 of 4; a has no H200
    assert shortfall(f, ask((16, "1g.18gb", H200))) == 2  # 2 free GPUs hold 7 each: 2 short of 16
    assert shortfall(f, ask((2, "full"))) == 0


@PROPERTY
@given(gpus_())
def test_availability_is_exactly_what_one_request_of_a_spec_gets(f):
    """What availability offers of a spec, in a cluster and group, a request of it is given there at
    once, and one more is not: the offer and the queue agree. Ever is the same on the emptied fleet."""
    for (cluster, group, model, profile), offer in availability(f.gpus).items():
        here = Fleet(tuple(g for g in f.gpus if g.cluster == cluster))
        for count, fleet_, expected in [
            (offer.now, here, True),
            (offer.now + 1, here, False),
            (offer.ever, emptied(here), True),
            (offer.ever + 1, emptied(here), False),
        ]:
            if count == 0:
                continue
            result = place(fleet_, Request("r", (Item(model, profile, count),), group))
            assert result.placed == expected, (cluster, group, model, profile, count, result.reason)


@PROPERTY
@given(gpus_())
def test_the_reasons_count_from_the_index_what_availability_offers(f):
    """The waiting reasons read the engine's index, the specs API a list of GPUs: the same counts."""
    index = FleetIndex.build(f.gpus)
    for (cluster, group, model, profile), offer in availability(f.gpus).items():
        buckets = index.buckets_for(cluster, model, group)
        assert obtainable_in(index, buckets, model, profile) == offer.now, (cluster, group, model, profile)


def test_availability_counts_a_group_and_the_whole_cluster():
    f = fleet(
        gpu("t0", "1g.10gb@0* 1g.10gb@1", cluster="a", node="t", group="training"),
        gpu("t1", off=True, cluster="a", node="t", group="training"),
        gpu("s0", off=True, busy=True, cluster="a", node="s", group="inference"),
        gpu("s1", off=True, cluster="a", node="s", group="inference", schedulable=False),
    )
    found = availability(f.gpus)
    assert found[("a", "training", H100, "full")] == Availability(now=1, ever=2)
    assert found[("a", "training", H100, "1g.10gb")] == Availability(now=1 + 7, ever=14)
    assert found[("a", "inference", H100, "full")] == Availability(now=0, ever=2)
    assert found[("a", None, H100, "full")] == Availability(now=1, ever=4)
    assert ("a", "development", H100, "full") not in found
