"""Shares of a GPU through the device plugin (facts in the GPU reference, "Sharing without MIG"): a node's
MIG-off GPUs advertised N times each, time-sliced or under MPS. The device plugin applies one sharing to
every MIG-off GPU of a node (its config has no per-device part), so a node is in one share mode at a time.

Words used here:
- share: one of the N replicas of a GPU; its profile names the kind and N: "ts-4" (time-sliced, a quarter),
  "mps-2" (MPS, a half).
- share mode: a node's sharing, written as its share profile; "" when its MIG-off GPUs are not shared.
- slots: share i of a GPU occupies [i, i + 1), so that no two allocations hold one share and a whole-GPU
  allocation ([0, 8)) excludes every share; hence at most 8 shares per GPU.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import TYPE_CHECKING

from pools import mig
from pools.kinds.base import GpuKind, gettext_noop

if TYPE_CHECKING:
    from pools.gpu_models import ModelInfo

SHARED_RESOURCE = "nvidia.com/gpu.shared"  # the device plugin's name for replicas with renameByDefault
# The device plugin refuses fewer than 2 replicas; more than 8 would leave the slots a whole GPU excludes.
SHARE_COUNTS = range(2, mig.MEMORY_SLICES + 1)


class Shares(GpuKind):
    """One kind of share: `prefix` names it in profiles, `strategy` is the device plugin's."""

    takes_whole_gpu = False
    gpu_figures = True
    measured_alone = False
    own_device = False  # the GPU is shared with other units: no claim can hold it alone

    def __init__(self, *, name: str, prefix: str, strategy: str, config_key: str, label: str, isolation: str):
        self.name = name
        self.prefix = prefix
        self.strategy = strategy  # feature discovery's nvidia.com/gpu.sharing-strategy
        self.config_key = config_key  # the device plugin config's key under `sharing`
        self.label = label
        self.isolation = isolation
        self.profile_noun = f"{name} share"
        self._profile = re.compile(rf"{prefix}-([1-9][0-9]?)")

    def replicas(self, profile: str) -> int:
        match = self._profile.fullmatch(profile)
        if match is None:
            raise ValueError(f"{profile!r} is not a {self.name} share.")
        return int(match[1])

    def profile_of(self, replicas: int) -> str:
        return f"{self.prefix}-{replicas}"

    def owns(self, profile: str) -> bool:
        return self._profile.fullmatch(profile) is not None

    def profiles(self, model: ModelInfo) -> list[str]:
        return self.every_profile()

    def every_profile(self) -> list[str]:
        """Its profiles, the same on every model, smallest share first."""
        return [self.profile_of(n) for n in reversed(SHARE_COUNTS)]

    def token(self, profile: str) -> str:
        return profile

    def profile_of_token(self, token: str) -> str | None:
        return token if self.owns(token) else None

    def offer_of(self, profile: str) -> str:
        return profile

    def profile_label(self, profile: str) -> str:
        return profile

    def compute_slices(self, model: ModelInfo, profile: str) -> Fraction:
        return Fraction(mig.COMPUTE_SLICES, self.replicas(profile))

    def memory_gb(self, model: ModelInfo, profile: str) -> float:
        return float(model.memory_gb)

    def max_per_gpu(self, model: ModelInfo, profile: str) -> int:
        return self.replicas(profile)

    def resource_name(self, profile: str) -> str:
        return SHARED_RESOURCE

    def profile_of_resource(self, resource: str) -> str | None:
        return None  # the resource does not say how many replicas: the node's share mode does

    def slots(self, model: ModelInfo, profile: str, start: int | None) -> tuple[int, int]:
        if start is None or not 0 <= start < self.replicas(profile):
            raise ValueError(
                f"A {profile} share is one of shares 0 to {self.replicas(profile) - 1}, not {start}."
            )
        return (start, start + 1)


class MpsShares(Shares):
    def memory_gb(self, model: ModelInfo, profile: str) -> float:
        return round(model.memory_gb / self.replicas(profile), 1)


TIME_SLICED = Shares(
    name="time-sliced",
    prefix="ts",
    strategy="time-slicing",
    config_key="timeSlicing",
    label=gettext_noop("time-sliced share"),
    isolation=gettext_noop(
        "A time-sliced share: the GPU takes turns between its shares. Nothing but time is isolated: every "
        "share sees all of its memory, and a fault in one stops them all."
    ),
)
MPS = MpsShares(
    name="mps",
    prefix="mps",
    strategy="mps",
    config_key="mps",
    label=gettext_noop("MPS share"),
    isolation=gettext_noop(
        "An MPS share: its own part of the memory and of the compute, limited but not isolated; a fault in "
        "one share stops them all."
    ),
)
