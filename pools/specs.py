"""Specs: what can be requested, named the way the API names it.

A spec is a GPU model and a profile: `h200-141gb.mig-1g.18gb` for a MIG instance,
`h200-141gb.full` for a whole GPU. Only models that the fleet has are offered.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils.translation import pgettext

from pools import mig

FULL = mig.FULL_GPU


def profile_label(profile: str) -> str:
    """A profile as people read it: a MIG profile's own name, or "full" in the reader's language."""
    return pgettext("a whole GPU, after its model", "full") if profile == FULL else profile


@dataclass(frozen=True)
class Spec:
    gpu_model: str
    profile: str  # a MIG profile, or "full"

    @property
    def id(self) -> str:
        kind = FULL if self.profile == FULL else f"mig-{self.profile}"
        return f"{self.gpu_model.lower()}.{kind}"

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
        if self.profile == FULL:
            return mig.COMPUTE_SLICES
        return mig.gpu_model(self.gpu_model).profile(self.profile).compute_slices

    @property
    def memory_gb(self) -> float:
        model = mig.gpu_model(self.gpu_model)
        if self.profile == FULL:
            return float(model.memory_gb)
        return float(self.profile.split(".")[1].split("+")[0].removesuffix("gb"))

    @property
    def resource_name(self) -> str:
        return mig.resource_name(self.profile)

    def max_per_gpu(self) -> int:
        if self.profile == FULL:
            return 1
        return mig.gpu_model(self.gpu_model).profile(self.profile).max_count


class UnknownSpec(ValueError):
    pass


def parse_spec(spec_id: str) -> Spec:
    """`h200-141gb.mig-1g.18gb` → Spec("H200-141GB", "1g.18gb"); UnknownSpec says what exists."""
    model_part, _dot, kind = spec_id.partition(".")
    by_lower = {name.lower(): name for name in mig.GPU_MODELS}
    if model_part not in by_lower or not kind:
        raise UnknownSpec(
            f"Unknown spec {spec_id!r}; specs look like h200-141gb.mig-1g.18gb or h100-80gb.full."
        )
    model = mig.gpu_model(by_lower[model_part])
    if kind == FULL:
        return Spec(model.name, FULL)
    profile = kind.removeprefix("mig-")
    if not kind.startswith("mig-") or profile not in model.profiles:
        profiles = ", ".join(model.profiles)
        raise UnknownSpec(
            f"Unknown spec {spec_id!r}: {model.name} has the MIG profiles {profiles} (and full)."
        )
    return Spec(model.name, profile)


def specs_of(models: list[str]) -> list[Spec]:
    """Every requestable spec of these GPU models: full GPUs, then each MIG profile small to large."""
    return [
        spec
        for name in sorted(models)
        for spec in [Spec(name, FULL), *(Spec(name, p) for p in mig.gpu_model(name).profiles)]
    ]
