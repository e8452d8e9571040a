"""The whole GPU: one unit per GPU, MIG off and not shared; every model has it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pools import mig
from pools.kinds.base import GpuKind, gettext_noop

if TYPE_CHECKING:
    from pools.gpu_models import ModelInfo

PROFILE = mig.FULL_GPU


class Whole(GpuKind):
    name = "whole"
    profile_noun = "whole-GPU profile"
    label = gettext_noop("whole GPU")
    isolation = gettext_noop("A whole GPU: nothing on it is shared with anyone else.")
    takes_whole_gpu = True
    gpu_figures = True
    profile = PROFILE  # its one profile
    measured_alone = True
    own_device = True

    def owns(self, profile: str) -> bool:
        return profile == PROFILE

    def profiles(self, model: ModelInfo) -> list[str]:
        return [PROFILE]

    def token(self, profile: str) -> str:
        return PROFILE

    def profile_of_token(self, token: str) -> str | None:
        return PROFILE if token == PROFILE else None

    def profile_label(self, profile: str) -> str:
        return gettext_noop("full")

    def compute_slices(self, model: ModelInfo, profile: str) -> int:
        return mig.COMPUTE_SLICES

    def memory_gb(self, model: ModelInfo, profile: str) -> float:
        return float(model.memory_gb)

    def max_per_gpu(self, model: ModelInfo, profile: str) -> int:
        return 1

    def resource_name(self, profile: str) -> str:
        return mig.FULL_GPU_RESOURCE

    def profile_of_resource(self, resource: str) -> str | None:
        return PROFILE if resource == mig.FULL_GPU_RESOURCE else None

    def slots(self, model: ModelInfo, profile: str, start: int | None) -> tuple[int, int]:
        return (0, mig.MEMORY_SLICES)
