"""The protocol every GPU kind answers: how a GPU is given out, and what one unit of it is.

Words used here:
- kind: a way of giving out a GPU: whole, MIG instances, and shares of a time-sliced or MPS GPU.
- profile: what a request's item names after its model, the portal's name for one unit of a kind ("full",
  "3g.40gb", "ts-4"). Every profile belongs to exactly one kind; `pools.kinds.kind_of` finds it.
- token: the profile as a spec id writes it after the model (`h100-80gb.full`, `h100-80gb.mig-3g.40gb`,
  `l40s-48gb.ts-4`).
- slots: the range a unit occupies on its GPU, which the allocation's exclusion constraint keeps apart: MIG
  memory slices for an instance, all of them for a whole GPU, one per share.

No Django, no I/O: the placement engine, the simulator and the benches use kinds without a database.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pools.gpu_models import ModelInfo


def gettext_noop(text: str) -> str:
    """Marks a label for translation (makemessages reads the name); pools/specs.py translates it."""
    return text


class UnknownProfile(ValueError):
    """A profile that no kind owns, or that its kind does not offer on the model."""


class GpuKind(ABC):
    name: str  # stable, in settings, forms and the API
    profile_noun: str  # what an error calls one of its profiles
    label: str  # how people read the kind, marked for translation
    isolation: str  # what one unit isolates from the others on its GPU, marked for translation
    takes_whole_gpu: bool  # a unit is the GPU itself, not a part of it
    gpu_figures: bool  # a unit's figures are read from its whole GPU (not from an instance of its own)
    measured_alone: bool  # those figures are the unit's alone, not shared with other units on its GPU
    own_device: bool  # a unit is a device of its own (a GPU, a MIG device) that one DRA claim can hold alone

    @abstractmethod
    def owns(self, profile: str) -> bool:
        """Whether the profile is one of this kind's (on some model)."""

    @abstractmethod
    def profiles(self, model: ModelInfo) -> list[str]:
        """The profiles this kind offers on the model, smallest first; empty where it offers none."""

    @abstractmethod
    def token(self, profile: str) -> str:
        """The profile as a spec id writes it after the model."""

    @abstractmethod
    def profile_of_token(self, token: str) -> str | None:
        """The profile a spec id's token names, when the token is this kind's; None otherwise."""

    def offer_of(self, profile: str) -> str:
        """What a GPU group must offer for a unit of the profile to be placed on its GPUs: the kind's name,
        or for a share the profile itself (a group offers time-slicing in fours, not time-slicing)."""
        return self.name

    def profile_label(self, profile: str) -> str:
        """The profile as people read it after its model; translated by pools/specs.py."""
        return profile

    @abstractmethod
    def compute_slices(self, model: ModelInfo, profile: str) -> int:
        """The compute slices one unit counts for, against quotas and in the capacity figures."""

    @abstractmethod
    def memory_gb(self, model: ModelInfo, profile: str) -> float:
        """The GPU memory one unit may use."""

    @abstractmethod
    def max_per_gpu(self, model: ModelInfo, profile: str) -> int:
        """Units of the profile one GPU can hold."""

    @abstractmethod
    def resource_name(self, profile: str) -> str:
        """The device plugin's resource a pod asks for, and the namespace's quota counts."""

    @abstractmethod
    def profile_of_resource(self, resource: str) -> str | None:
        """The profile behind a device plugin resource, when the resource is this kind's; None otherwise."""

    @abstractmethod
    def slots(self, model: ModelInfo, profile: str, start: int | None) -> tuple[int, int]:
        """The [lower, upper) range one unit at `start` occupies on its GPU."""

    def check(self, model: ModelInfo, profile: str) -> None:
        """Raises UnknownProfile, saying what the model offers, when the kind does not offer the profile."""
        offered = self.profiles(model)
        if profile not in offered:
            listed = ", ".join(offered) or "none"
            raise UnknownProfile(f"{model.name} has no {self.profile_noun} {profile!r}; it has {listed}.")
