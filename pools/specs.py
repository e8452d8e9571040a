"""Specs: what can be requested, named the way the API names it.

A spec is a GPU model and a profile of one of its kinds (pools/kinds/): `h200-141gb.mig-1g.18gb` for a MIG
instance, `h200-141gb.full` for a whole GPU, `l40s-48gb.full` for a GPU outside the MIG catalogue. Only
models that the fleet has are offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from django.utils.translation import gettext

from pools import kinds
from pools.gpu_models import ModelInfo, UnknownGpuModel, is_model_name, model_info
from pools.kinds import GpuKind, UnknownProfile, kind_of


def profile_label(profile: str) -> str:
    """A profile as people read it after its model: a MIG profile's own name, "full" in the reader's
    language."""
    return gettext(kind_of(profile).profile_label(profile))


@dataclass(frozen=True)
class Spec:
    gpu_model: str
    profile: str  # a profile of one of the model's kinds

    @cached_property
    def kind(self) -> GpuKind:
        return kind_of(self.profile)

    @cached_property
    def model(self) -> ModelInfo:
        return model_info(self.gpu_model)

    @property
    def id(self) -> str:
        return f"{self.gpu_model.lower()}.{self.kind.token(self.profile)}"

    @property
    def label(self) -> str:
        """How people read it, as a request's items show it: `H100-80GB 3g.40gb`, `H100-80GB full`."""
        return f"{self.gpu_model} {profile_label(self.profile)}"

    @property
    def media_extension(self) -> bool:
        """A `+me` profile: the MIG instance also holds the GPU's media engines (one per GPU)."""
        return self.profile.endswith("+me")

    @property
    def compute_slices(self) -> int:
        return self.kind.compute_slices(self.model, self.profile)

    @property
    def memory_gb(self) -> float:
        return self.kind.memory_gb(self.model, self.profile)

    @property
    def resource_name(self) -> str:
        return self.kind.resource_name(self.profile)

    def max_per_gpu(self) -> int:
        return self.kind.max_per_gpu(self.model, self.profile)


class UnknownSpec(ValueError):
    pass


def parse_spec(spec_id: str) -> Spec:
    """`h200-141gb.mig-1g.18gb` → Spec("H200-141GB", "1g.18gb"); UnknownSpec says what exists."""
    model_part, _dot, token = spec_id.partition(".")
    name = model_part.upper()
    if not token or model_part != model_part.lower() or not is_model_name(name):
        raise UnknownSpec(
            f"Unknown spec {spec_id!r}; specs look like h200-141gb.mig-1g.18gb or h100-80gb.full."
        )
    try:
        model = model_info(name)
    except UnknownGpuModel as error:
        raise UnknownSpec(str(error)) from None
    for kind in kinds.KINDS:
        profile = kind.profile_of_token(token)
        if profile is not None:
            try:
                kind.check(model, profile)
            except UnknownProfile:
                break
            return Spec(model.name, profile)
    offered = ", ".join(
        Spec(model.name, p).id for p in kinds.profiles_of(model) if kind_of(p) not in kinds.SHARE_KINDS
    )
    counts = kinds.SHARE_COUNTS
    shares = " or ".join(f"{model.name.lower()}.{kind.prefix}-N" for kind in kinds.SHARE_KINDS)
    raise UnknownSpec(
        f"Unknown spec {spec_id!r}: {model.name} is offered as {offered}, or in shares {shares} "
        f"(N from {counts.start} to {counts.stop - 1}) where a GPU group offers them."
    )


def specs_of(models: list[str]) -> list[Spec]:
    """Every requestable spec of these GPU models: kind by kind (full GPUs, then each MIG profile small to
    large)."""
    return [Spec(name, profile) for name in sorted(models) for profile in kinds.profiles_of(model_info(name))]
