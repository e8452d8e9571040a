"""GPU kinds: the ways the portal gives out a GPU, one protocol (pools/kinds/base.py) and this registry.

Code that must treat units of different kinds differently asks the unit's kind (`kind_of(profile)`) rather
than testing profile names. A kind is added in one module of this package, listed in KINDS, with its tests.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache

from pools.gpu_models import ModelInfo, UnknownGpuModel, model_info
from pools.kinds.base import GpuKind, UnknownProfile
from pools.kinds.mig_instances import MigInstances
from pools.kinds.shares import MPS, SHARE_COUNTS, SHARED_RESOURCE, TIME_SLICED, Shares
from pools.kinds.whole import Whole

__all__ = [
    "DEFAULT_OFFERS",
    "KINDS",
    "MIG",
    "MPS",
    "SHARED_RESOURCE",
    "SHARE_COUNTS",
    "SHARE_KINDS",
    "TIME_SLICED",
    "WHOLE",
    "GpuKind",
    "UnknownProfile",
    "compute_slices",
    "counted_slices",
    "kind_named",
    "kind_of",
    "parse_offers",
    "profile_of_resource",
    "profiles_of",
    "resource_name",
    "share_kind",
    "share_profile",
    "shown_slices",
]

WHOLE = Whole()
MIG = MigInstances()
# In the order specs are offered: a whole GPU first, then its parts.
SHARE_KINDS: tuple[Shares, ...] = (TIME_SLICED, MPS)
KINDS: tuple[GpuKind, ...] = (WHOLE, MIG, *SHARE_KINDS)
_BY_NAME = {kind.name: kind for kind in KINDS}
# What a GPU group offers unless an operator says otherwise: whole GPUs and MIG instances.
DEFAULT_OFFERS = (WHOLE.name, MIG.name)


def share_profile(strategy: str, replicas: int) -> str:
    """The share profile of feature discovery's `nvidia.com/gpu.sharing-strategy` and `.replicas` labels;
    "" for a node whose GPUs are not shared. Raises ValueError for a strategy or count the portal cannot
    give out."""
    if strategy in ("", "none") or replicas <= 1:
        return ""
    for kind in SHARE_KINDS:
        if kind.strategy == strategy:
            if replicas not in SHARE_COUNTS:
                raise ValueError(
                    f"{replicas} {strategy} replicas per GPU: the portal gives out {SHARE_COUNTS.start} to "
                    f"{SHARE_COUNTS.stop - 1} shares of a GPU."
                )
            return kind.profile_of(replicas)
    raise ValueError(f"Unknown sharing strategy {strategy!r}; the device plugin's are time-slicing and mps.")


def share_kind(profile: str) -> Shares:
    """The kind of a share profile; ValueError for a profile that is no share's."""
    for kind in SHARE_KINDS:
        if kind.owns(profile):
            return kind
    raise ValueError(f"{profile!r} is not a share profile (such as ts-4 or mps-2).")


def parse_offers(values: object) -> tuple[str, ...]:
    """A GPU group's offers, checked: a list of kind names (whole, mig) and share profiles (ts-4, mps-2),
    each once. Raises ValueError saying what is wrong."""
    if not isinstance(values, list | tuple) or not all(isinstance(value, str) for value in values):
        raise ValueError("Offers are a list of names, such as whole, mig, ts-4 or mps-2.")
    if not values:
        raise ValueError("A GPU group offers at least one kind.")
    if len(set(values)) != len(values):
        raise ValueError("Each offer is listed once.")
    for value in values:
        if value in (WHOLE.name, MIG.name):
            continue
        try:
            share_kind(value).replicas(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is no offer: offers are whole, mig, and shares ts-N (time-sliced) or mps-N (MPS) "
                f"with N from {SHARE_COUNTS.start} to {SHARE_COUNTS.stop - 1}."
            ) from None
        if share_kind(value).replicas(value) not in SHARE_COUNTS:
            raise ValueError(
                f"{value!r}: a GPU is shared {SHARE_COUNTS.start} to {SHARE_COUNTS.stop - 1} ways, as the "
                "device plugin allows at least 2 replicas and the portal keeps at most 8 shares per GPU."
            )
    return tuple(values)


@lru_cache(maxsize=4096)
def kind_of(profile: str) -> GpuKind:
    """The kind a profile belongs to; UnknownProfile when none owns it."""
    for kind in KINDS:
        if kind.owns(profile):
            return kind
    raise UnknownProfile(f"{profile!r} is not a profile of any GPU kind.")


def kind_named(name: str) -> GpuKind:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownProfile(f"No GPU kind is named {name!r}; kinds: {', '.join(_BY_NAME)}.") from None


def profiles_of(model: ModelInfo) -> list[str]:
    """Every profile a GPU of the model can be given out as, kind by kind."""
    return [profile for kind in KINDS for profile in kind.profiles(model)]


def compute_slices(model: str, profile: str) -> int:
    """Compute slices one unit of the profile counts for on a GPU of the model (pools/kinds/base.py).
    Raises UnknownGpuModel or UnknownProfile for what no kind offers."""
    kind = kind_of(profile)
    return kind.compute_slices(model_info(model), profile)


def counted_slices(model: str, profile: str) -> int:
    """compute_slices, or 0 for what no kind offers: an allocation of a model or profile the catalogue no
    longer knows is still held, but counts for no quota nor capacity figure."""
    try:
        return compute_slices(model, profile)
    except (UnknownGpuModel, UnknownProfile):
        return 0


def shown_slices(value: int | Fraction) -> int | float:
    """Compute slices as people and the API read them: a whole number as it is, a fraction (shares) to two
    decimals."""
    return int(value) if value == int(value) else round(float(value), 2)


def resource_name(profile: str) -> str:
    """The device plugin's resource for a unit of the profile."""
    return kind_of(profile).resource_name(profile)


def profile_of_resource(resource: str) -> str | None:
    """The profile behind a device plugin resource; None for a resource no kind gives out."""
    for kind in KINDS:
        profile = kind.profile_of_resource(resource)
        if profile is not None:
            return profile
    return None
