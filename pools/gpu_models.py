"""GPU models: every NVIDIA GPU a fleet may hold, named as the portal names it, with its memory and, for the
models the MIG catalogue describes, their MIG geometry.

Words used here:
- model name: the family and the memory as sold, `<FAMILY>-<N>GB`: "H100-80GB", "L40S-48GB", "T4-16GB". The
  MIG catalogue's models (pools/mig.py) keep their catalogue names.
- geometry: a model's MIG profiles and layout rules, known for the catalogue's models only. A model outside
  the catalogue is given out whole (or in shares, pools/kinds/), never refused.
- MIG-capable: what a node says of its GPUs (feature discovery's `nvidia.com/mig.capable`). A capable model
  whose geometry the catalogue lacks is given out whole until the catalogue knows it.

No Django, no I/O: everything here is a function of its arguments.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from pools.mig import GPU_MODELS, GpuModel, UnknownGpuModel

__all__ = [
    "ModelInfo",
    "NoGeometry",
    "UnknownGpuModel",
    "is_model_name",
    "model_from_node_labels",
    "model_info",
]

MAX_NAME = 32  # the longest model name a GPU row keeps
# The whole name: family tokens, then the memory as sold.
_NAME = re.compile(r"([A-Z0-9]+(?:-[A-Z0-9]+)*)-(\d{1,4})GB")
_SIZE_TOKEN = re.compile(r"(\d+)GB")
# Tokens of a product label that say nothing of the model: the maker, the form factor, the memory type, and
# what feature discovery appends for a shared GPU.
_NOISE = re.compile(r"NVIDIA|TESLA|PCIE|SXM\d*|HBM\d*E?|SHARED|\d+GB")
# The catalogue's families; within one, the memory tells its models apart.
_FAMILIES = tuple(dict.fromkeys(name.split("-")[0] for name in GPU_MODELS))
_SIZE_TOLERANCE = 0.10
# Memory as sold, in GB: cards report less than this (ECC and the driver's reserve), so a model's size is the
# first of these at or above what it reports (an L40S reports 45 GiB of its 48 GB).
_SIZES_SOLD = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 144, 180, 186, 192, 288)


class NoGeometry(ValueError):
    """MIG on a GPU whose model the MIG catalogue has no geometry for."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    memory_gb: int  # as sold
    mig: GpuModel | None = None  # its MIG geometry; None outside the catalogue

    @property
    def family(self) -> str:
        return self.name.rsplit("-", 1)[0]

    def geometry(self) -> GpuModel:
        """Its MIG geometry, for a GPU with MIG on; NoGeometry outside the catalogue."""
        if self.mig is None:
            raise NoGeometry(f"{self.name} has no MIG geometry in the catalogue, so MIG cannot be on.")
        return self.mig


def is_model_name(name: str) -> bool:
    return len(name) <= MAX_NAME and _NAME.fullmatch(name) is not None


@lru_cache(maxsize=1024)
def model_info(name: str) -> ModelInfo:
    """The model of that name: the catalogue's, or any well-formed name outside it (given out whole)."""
    catalogued = GPU_MODELS.get(name)
    if catalogued is not None:
        return ModelInfo(name, catalogued.memory_gb, catalogued)
    match = _NAME.fullmatch(name) if len(name) <= MAX_NAME else None
    if match is None:
        raise UnknownGpuModel(
            f"Unknown GPU model {name!r}: a model is named by its family and the memory as sold, like "
            f"H100-80GB or L40S-48GB (at most {MAX_NAME} characters)."
        )
    return ModelInfo(name, int(match[2]))


def model_from_node_labels(product: str, memory_mib: int | None) -> str:
    """The model name for feature discovery's `nvidia.com/gpu.product` and `nvidia.com/gpu.memory` labels.

    A catalogue family's model is told apart by the size the product names, else by the memory, which must be
    within 10 % of one of its sizes. Any other GPU is named by its product and the memory as sold.
    """
    # Whole tokens, not substrings: "NVIDIA-GH200-480GB" is no H200, and in the single strategy the product
    # ends in "-MIG-1g.5gb", whose "5gb" is not the card's size.
    tokens = re.split(r"[-_\s]+", product.upper())
    if "MIG" in tokens:
        tokens = tokens[: tokens.index("MIG")]
    family = next((token for token in tokens if token in _FAMILIES), None)
    if family is not None and (found := _catalogued(family, tokens, memory_mib)) is not None:
        return found
    name_tokens = [token for token in tokens if token and not _NOISE.fullmatch(token)]
    size = _size_sold(memory_mib) or next(
        (int(match[1]) for token in tokens if (match := _SIZE_TOKEN.fullmatch(token))), None
    )
    name = f"{'-'.join(name_tokens)}-{size}GB"
    if not name_tokens or size is None or not is_model_name(name):
        raise UnknownGpuModel(
            f"Cannot name the GPU of product {product!r} with {memory_mib} MiB: the node's labels "
            "nvidia.com/gpu.product and nvidia.com/gpu.memory must name a product and its memory."
        )
    return name


def _catalogued(family: str, tokens: list[str], memory_mib: int | None) -> str | None:
    models = [m for m in GPU_MODELS.values() if m.name.startswith(f"{family}-")]
    for token in tokens:
        if (match := _SIZE_TOKEN.fullmatch(token)) and (
            named := next((m for m in models if m.memory_gb == int(match[1])), None)
        ):
            return named.name
    if memory_mib:
        gib = memory_mib / 1024
        nearest = min(models, key=lambda m: abs(m.memory_gb - gib))
        if abs(nearest.memory_gb - gib) <= _SIZE_TOLERANCE * nearest.memory_gb:
            return nearest.name
    return None


def _size_sold(memory_mib: int | None) -> int | None:
    if not memory_mib or memory_mib < 0:
        return None
    gib = memory_mib / 1024
    return next((size for size in _SIZES_SOLD if size >= gib), math.ceil(gib))
