"""The MIG catalogue as plain data: profiles per GPU model, layout rules, placement and stranded capacity.

Words used here (facts from NVIDIA's MIG User Guide, "Supported MIG Profiles", and the GPU Operator's
documentation of its MIG manager and device plugin):
- memory slice, compute slice: a GPU has 8 of the one and 7 of the other. A MIG instance takes consecutive
  memory slices from an allowed start, and some compute slices.
- profile: a kind of instance, such as "3g.40gb"; "+me" adds the GPU's one media extension.
- layout: the instances on one GPU, each an `Instance(start, profile)`.
- placement: giving starts to a multiset of profiles so that the layout is valid.
- stranded: free compute slices that no new instance can use, because the memory slices they would need are
  taken or sit where no profile can start.

No Django, no I/O, no clock: everything here is a function of its arguments.
"""

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from itertools import combinations

FULL_GPU_RESOURCE = "nvidia.com/gpu"
FULL_GPU = "full"  # the profile name the portal gives a whole GPU with MIG off
MEMORY_SLICES = 8
COMPUTE_SLICES = 7
MAX_INSTANCES = 7


class MigState(StrEnum):
    """Values of the node label nvidia.com/mig.config.state (the GPU Operator's MIG manager), plus unknown
    when it is missing."""

    PENDING = "pending"
    REBOOTING = "rebooting"
    SUCCESS = "success"
    FAILED = "failed"
    UNKNOWN = "unknown"


# While a node is in one of these, its layout is changing: nothing on it is placed or counted as free.
MIG_CHANGING = (MigState.PENDING, MigState.REBOOTING)

_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
_MEDIA_EXTENSION = "+me"
# The device plugin's mixed strategy writes "+" as "." (NVIDIA k8s-device-plugin, MIG strategies).
_MIG_RESOURCE = re.compile(re.escape(_MIG_RESOURCE_PREFIX) + r"(\d+g\.\d+gb)(\.me)?")
_PROFILE_NAME = re.compile(r"\d+g\.\d+gb(\+me)?")

# The MIG User Guide's profile tables and the placements `nvidia-smi mig -lgipp` lists, one row per class.
# A100-80GB and H100-80GB share a column: the same profile names.
# mem, cmp: memory and compute slices an instance takes; max: instances of the profile a GPU can hold.
# A profile is named by its compute slices and the memory of its memory slices as sold, rounded to whole GB:
# a model's row gives that memory for 1, 2 and 4 slices (8 slices are the whole card). Every class has the
# same geometry on each model listed.
# class: (compute prefix, mem slices, cmp slices, max per GPU, starts, media extension)
_PROFILE_CLASSES: tuple[tuple[str, int, int, int, tuple[int, ...], bool], ...] = (
    ("1g", 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), False),
    ("1g", 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), True),
    ("1g", 2, 1, 4, (0, 2, 4, 6), False),
    ("2g", 2, 2, 3, (0, 2, 4), False),
    ("3g", 4, 3, 2, (0, 4), False),
    ("4g", 4, 4, 1, (0,), False),
    ("7g", 8, 7, 1, (0,), False),
)
# catalogue name, memory in GB as sold, GB of 1, 2 and 4 memory slices. H100-94GB is the H100 NVL, GH200-96GB
# the Hopper GPU of a Grace Hopper superchip, GB200-186GB the Blackwell GPU of a Grace Blackwell superchip.
# fmt: off
_MODELS: tuple[tuple[str, int, tuple[int, int, int]], ...] = (
    ("A100-40GB",   40,  (5, 10, 20)),
    ("A100-80GB",   80,  (10, 20, 40)),
    ("H100-80GB",   80,  (10, 20, 40)),
    ("H100-94GB",   94,  (12, 24, 47)),
    ("GH200-96GB",  96,  (12, 24, 48)),
    ("H200-141GB",  141, (18, 35, 71)),
    ("B200-180GB",  180, (23, 45, 90)),
    ("GB200-186GB", 186, (23, 47, 93)),
)
# fmt: on
# GiB per class as `nvidia-smi mig -lgip` reports it on an H100-80GB and an H200-141GB. Only these were
# recorded; the A100-80GB shares the H100's names but not its listing, so everything else stays None.
_USABLE_MEMORY_GIB: dict[str, dict[str, float]] = {
    "H100-80GB": {"1g": 9.75, "2g": 19.62, "3g": 39.50, "4g": 39.50, "7g": 79.25},
    "H200-141GB": {"1g": 16.00, "2g": 32.50, "7g": 140.00},
}


class UnknownGpuModel(ValueError):
    """A GPU model the catalogue does not describe."""


class UnknownProfile(ValueError):
    """A MIG profile that the GPU model does not offer."""


class LayoutError(ValueError):
    """A MIG layout that breaks the geometry rules; the message lists every broken rule."""


@dataclass(frozen=True)
class Profile:
    name: str
    memory_slices: int
    compute_slices: int
    max_count: int  # instances of this profile one GPU can hold
    starts: tuple[int, ...]  # memory slices an instance of it may begin at
    usable_memory_gib: float | None  # as measured; None where no capture was published
    media_extension: bool

    @property
    def resource_name(self) -> str:
        return resource_name(self.name)


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gb: int
    # Left out of the hash (a dict has none) but not out of equality.
    profiles: dict[str, Profile] = field(hash=False)

    def profile(self, name: str) -> Profile:
        try:
            return self.profiles[name]
        except KeyError:
            known = ", ".join(self.profiles)
            raise UnknownProfile(f"{self.name} has no MIG profile {name!r}; it has {known}.") from None


@dataclass(frozen=True, order=True)
class Instance:
    start: int
    profile: str

    def __str__(self) -> str:
        return f"{self.profile} at {self.start}"


def _catalogue() -> dict[str, GpuModel]:
    models = {}
    for model_name, memory_gb, sizes in _MODELS:
        usable = _USABLE_MEMORY_GIB.get(model_name, {})
        sold = {1: sizes[0], 2: sizes[1], 4: sizes[2], MEMORY_SLICES: memory_gb}
        profiles = {}
        for prefix, memory_slices, compute_slices, max_count, starts, media in _PROFILE_CLASSES:
            name = f"{prefix}.{sold[memory_slices]}gb" + (_MEDIA_EXTENSION if media else "")
            one_with_two_slices = prefix == "1g" and memory_slices == 2
            class_name = (
                prefix + (_MEDIA_EXTENSION if media else "") + ("/2mem" if one_with_two_slices else "")
            )
            profiles[name] = Profile(
                name=name,
                memory_slices=memory_slices,
                compute_slices=compute_slices,
                max_count=max_count,
                starts=starts,
                usable_memory_gib=usable.get(class_name),
                media_extension=media,
            )
        models[model_name] = GpuModel(name=model_name, memory_gb=memory_gb, profiles=profiles)
    return models


GPU_MODELS: dict[str, GpuModel] = _catalogue()


def gpu_model(name: str) -> GpuModel:
    try:
        return GPU_MODELS[name]
    except KeyError:
        raise UnknownGpuModel(f"Unknown GPU model {name!r}; known models: {', '.join(GPU_MODELS)}.") from None


def is_profile_name(name: str) -> bool:
    """Whether the name has the shape of a MIG profile ("3g.40gb", "1g.10gb+me"), on any model."""
    return _PROFILE_NAME.fullmatch(name) is not None


def resource_name(profile_name: str) -> str:
    """The device plugin's resource for a MIG profile (mixed strategy)."""
    return _MIG_RESOURCE_PREFIX + profile_name.replace("+", ".")


def profile_from_resource(resource: str) -> str | None:
    """The MIG profile behind a device plugin resource; None for resources that are not MIG instances.

    Any profile of the MIG shape is returned, even one outside the catalogue: a node may hold models we do
    not describe yet, and the caller decides what to do with them.
    """
    match = _MIG_RESOURCE.fullmatch(resource)
    if match is None:
        return None
    return match[1] + (_MEDIA_EXTENSION if match[2] else "")


def _slices(instance: Instance, profile: Profile) -> range:
    return range(instance.start, instance.start + profile.memory_slices)


def _memory_slices(values: Iterable[int]) -> str:
    listed = [str(value) for value in values]
    return f"memory slice{'s' if len(listed) > 1 else ''} {', '.join(listed)}"


def layout_errors(model: GpuModel, instances: Iterable[Instance]) -> list[str]:
    """Every rule the layout breaks, one sentence each; an empty list means the GPU can hold it."""
    layout = sorted(instances)
    errors: list[str] = []
    known: list[tuple[Instance, Profile]] = []
    for instance in layout:
        profile = model.profiles.get(instance.profile)
        if profile is None:
            errors.append(f"{instance}: {model.name} has no MIG profile {instance.profile!r}.")
            continue
        known.append((instance, profile))
        if instance.start not in profile.starts:
            allowed = _memory_slices(profile.starts)
            errors.append(f"{instance}: {profile.name} can start only at {allowed}.")
        slices = _slices(instance, profile)
        if slices.start < 0 or slices.stop > MEMORY_SLICES:
            errors.append(
                f"{instance}: it would take memory slices {slices.start} to {slices.stop - 1}, "
                f"but a GPU has slices 0 to {MEMORY_SLICES - 1}."
            )
    for (a, a_profile), (b, b_profile) in combinations(known, 2):
        shared = sorted(set(_slices(a, a_profile)) & set(_slices(b, b_profile)))
        if shared:
            errors.append(f"{a} and {b} overlap on {_memory_slices(shared)}.")

    counts = Counter(instance.profile for instance, _ in known)
    media = [instance for instance, profile in known if profile.media_extension]
    for name, count in counts.items():
        profile = model.profiles[name]
        # Two of a +me profile is the media-extension rule below, said once.
        if count > profile.max_count and not (profile.media_extension and len(media) > 1):
            errors.append(f"{count} instances of {name}, but at most {profile.max_count} fit on a GPU.")
    if len(media) > 1:
        listed = ", ".join(str(instance) for instance in media)
        errors.append(f"{len(media)} media-extension instances ({listed}), but a GPU has only one.")
    compute = sum(profile.compute_slices for _, profile in known)
    if compute > COMPUTE_SLICES:
        errors.append(f"The instances need {compute} compute slices, but a GPU has {COMPUTE_SLICES}.")
    if len(layout) > MAX_INSTANCES:
        errors.append(f"{len(layout)} instances, but a GPU holds at most {MAX_INSTANCES}.")
    return errors


def validate_layout(model: GpuModel, instances: Iterable[Instance]) -> None:
    errors = layout_errors(model, instances)
    if errors:
        raise LayoutError(f"This MIG layout does not fit on one {model.name}: {' '.join(errors)}")


class _Packing:
    """A layout being built by the searches below, kept as a bit mask and counters so that each candidate
    addition is checked in constant time. It applies the rules of `layout_errors` to one addition."""

    def __init__(self, model: GpuModel, instances: Iterable[Instance]) -> None:
        self.occupied = 0
        self.counts: Counter[str] = Counter()
        self.media = 0
        self.instances = 0
        self.compute = 0
        for instance in instances:
            self.add(model.profile(instance.profile), instance.start)

    def fits(self, profile: Profile, start: int) -> bool:
        return (
            start in profile.starts
            and 0 <= start <= MEMORY_SLICES - profile.memory_slices
            and not self.occupied & _mask(profile, start)
            and self.counts[profile.name] < profile.max_count
            and not (profile.media_extension and self.media)
            and self.instances < MAX_INSTANCES
            and self.compute + profile.compute_slices <= COMPUTE_SLICES
        )

    def add(self, profile: Profile, start: int) -> None:
        self._change(profile, start, 1)

    def remove(self, profile: Profile, start: int) -> None:
        self._change(profile, start, -1)

    def _change(self, profile: Profile, start: int, step: int) -> None:
        self.occupied ^= _mask(profile, start)
        self.counts[profile.name] += step
        self.media += step if profile.media_extension else 0
        self.instances += step
        self.compute += step * profile.compute_slices


def _mask(profile: Profile, start: int) -> int:
    return ((1 << profile.memory_slices) - 1) << start


def place_profiles(model: GpuModel, counts: Mapping[str, int]) -> list[Instance] | None:
    """Starts for a multiset of profiles on an empty GPU, or None when no layout holds them all.

    Like the MIG manager, which tries creation orders until one fits: larger instances first, each at the
    lowest start that still lets the rest fit. The same multiset always gets the same layout.
    """
    for name, count in counts.items():
        model.profile(name)
        if count < 0:
            raise ValueError(f"A count of {name} cannot be negative (got {count}).")
    # Before building the list: a count from a request can be any size.
    if sum(counts.values()) > MAX_INSTANCES:
        return None
    wanted = [model.profile(name) for name, count in counts.items() for _ in range(count)]
    catalogue_order = list(model.profiles)
    wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, catalogue_order.index(p.name)))
    packing = _Packing(model, ())
    placed: list[Instance] = []

    def place(index: int) -> bool:
        if index == len(wanted):
            return True
        profile = wanted[index]
        # Copies of one profile take ascending starts: their permutations would only repeat failures.
        lowest = placed[-1].start + 1 if index and wanted[index - 1] == profile else 0
        for start in profile.starts:
            if start >= lowest and packing.fits(profile, start):
                packing.add(profile, start)
                placed.append(Instance(start, profile.name))
                if place(index + 1):
                    return True
                packing.remove(profile, start)
                placed.pop()
        return False

    return sorted(placed) if place(0) else None


def free_memory_slices(model: GpuModel, instances: Iterable[Instance]) -> set[int]:
    taken: set[int] = set()
    for instance in instances:
        taken.update(_slices(instance, model.profile(instance.profile)))
    return set(range(MEMORY_SLICES)) - taken


def used_compute_slices(model: GpuModel, instances: Iterable[Instance]) -> int:
    return sum(model.profile(instance.profile).compute_slices for instance in instances)


def placeable_compute_slices(model: GpuModel, instances: Iterable[Instance]) -> int:
    """The most compute slices that new instances could still add, leaving the existing ones where they are.

    Exact: it tries every set of additions (a couple of thousand checks at worst). Raises LayoutError
    when the existing layout is not valid, since nothing can be added to a layout that cannot exist.
    """
    layout = list(instances)
    validate_layout(model, layout)
    packing = _Packing(model, layout)
    candidates = [(p, start) for p in model.profiles.values() for start in p.starts if packing.fits(p, start)]
    budget = COMPUTE_SLICES - packing.compute
    best = 0

    def search(first: int, added: int) -> None:
        nonlocal best
        best = max(best, added)
        for index in range(first, len(candidates)):
            if best == budget:  # every free compute slice is used: nothing can do better
                return
            profile, start = candidates[index]
            if packing.fits(profile, start):
                packing.add(profile, start)
                search(index + 1, added + profile.compute_slices)
                packing.remove(profile, start)

    search(0, 0)
    return best


def stranded_compute_slices(model: GpuModel, instances: Iterable[Instance]) -> int:
    """Free compute slices that no addition can ever use: the fragmentation cost of this layout."""
    layout = list(instances)
    return COMPUTE_SLICES - used_compute_slices(model, layout) - placeable_compute_slices(model, layout)
