"""GPU kinds: the ways the portal gives out a GPU, one protocol (pools/kinds/base.py) and this registry.

Code that must treat units of different kinds differently asks the unit's kind (`kind_of(profile)`) rather
than testing profile names. A kind is added in one module of this package, listed in KINDS, with its tests.
"""

from __future__ import annotations

from functools import lru_cache

from pools.gpu_models import ModelInfo, UnknownGpuModel, model_info
from pools.kinds.base import GpuKind, UnknownProfile
from pools.kinds.mig_instances import MigInstances
from pools.kinds.whole import Whole

__all__ = [
    "KINDS",
    "MIG",
    "WHOLE",
    "GpuKind",
    "UnknownProfile",
    "compute_slices",
    "counted_slices",
    "kind_named",
    "kind_of",
    "profile_of_resource",
    "profiles_of",
    "resource_name",
]

WHOLE = Whole()
MIG = MigInstances()
# In the order specs are offered: a whole GPU first, then its parts.
KINDS: tuple[GpuKind, ...] = (WHOLE, MIG)
_BY_NAME = {kind.name: kind for kind in KINDS}


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
