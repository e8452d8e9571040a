"""MIG instances: a GPU cut into isolated parts by the catalogue's geometry (pools/mig.py); only the
catalogue's models have it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pools import mig
from pools.kinds.base import GpuKind, UnknownProfile, gettext_noop

if TYPE_CHECKING:
    from pools.gpu_models import ModelInfo

_TOKEN_PREFIX = "mig-"


class MigInstances(GpuKind):
    name = "mig"
    profile_noun = "MIG profile"
    label = gettext_noop("MIG instance")
    isolation = gettext_noop(
        "A MIG instance: its own memory, cache and compute, and a fault in one instance stays in it."
    )
    takes_whole_gpu = False
    gpu_figures = False
    measured_alone = True
    own_device = True

    def owns(self, profile: str) -> bool:
        return mig.is_profile_name(profile)

    def profiles(self, model: ModelInfo) -> list[str]:
        return list(model.mig.profiles) if model.mig is not None else []

    def token(self, profile: str) -> str:
        return _TOKEN_PREFIX + profile

    def profile_of_token(self, token: str) -> str | None:
        profile = token.removeprefix(_TOKEN_PREFIX)
        return profile if token.startswith(_TOKEN_PREFIX) and self.owns(profile) else None

    def compute_slices(self, model: ModelInfo, profile: str) -> int:
        return self._profile(model, profile).compute_slices

    def memory_gb(self, model: ModelInfo, profile: str) -> float:
        return float(profile.split(".")[1].split("+")[0].removesuffix("gb"))

    def max_per_gpu(self, model: ModelInfo, profile: str) -> int:
        return self._profile(model, profile).max_count

    def resource_name(self, profile: str) -> str:
        return mig.resource_name(profile)

    def profile_of_resource(self, resource: str) -> str | None:
        return mig.profile_from_resource(resource)

    def slots(self, model: ModelInfo, profile: str, start: int | None) -> tuple[int, int]:
        if start is None:
            raise ValueError(f"A {profile} instance needs the memory slice it starts at.")
        return (start, start + self._profile(model, profile).memory_slices)

    def check(self, model: ModelInfo, profile: str) -> None:
        self._profile(model, profile)

    def _profile(self, model: ModelInfo, profile: str) -> mig.Profile:
        if model.mig is None:
            raise UnknownProfile(
                f"{model.name} has no MIG profile {profile!r}: the MIG catalogue has no geometry for it, "
                "so it is given out whole."
            )
        try:
            return model.mig.profile(profile)
        except mig.UnknownProfile as error:
            raise UnknownProfile(str(error)) from None
