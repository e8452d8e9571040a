"""GPU models by name and from a node's feature discovery labels: the catalogue's models told apart by size,
any other GPU named from its product and memory and given out whole, never refused."""

import pytest

from pools.gpu_models import (
    MAX_NAME,
    NoGeometry,
    UnknownGpuModel,
    is_model_name,
    model_from_node_labels,
    model_info,
)
from pools.mig import GPU_MODELS


@pytest.mark.parametrize(
    ("product", "memory_mib", "model"),
    [
        ("NVIDIA-H200", 143771, "H200-141GB"),
        ("NVIDIA-H100-80GB-HBM3", 81559, "H100-80GB"),
        ("NVIDIA-H100-SXM5-80GB", 81559, "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", None, "H100-80GB"),
        ("NVIDIA-H100-PCIe", 81559, "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA-A100-PCIE-40GB", 40960, "A100-40GB"),
        ("NVIDIA-A100-80GB-PCIe", 81920, "A100-80GB"),
        ("NVIDIA-A100-SXM4", 40960, "A100-40GB"),
        ("NVIDIA-A100-SXM4", 81920, "A100-80GB"),
        ("NVIDIA-B200", 183359, "B200-180GB"),
        ("NVIDIA-H100-NVL", 95830, "H100-94GB"),
        ("NVIDIA-H200-NVL", 143771, "H200-141GB"),
        # Grace Hopper and Grace Blackwell: not an H200 nor a B200, and the product's 480GB is the
        # superchip's memory, not the GPU's
        ("NVIDIA-GH200-480GB", 97871, "GH200-96GB"),
        ("NVIDIA-GB200", 189471, "GB200-186GB"),
        # the product's size wins over the memory label
        ("NVIDIA-A100-SXM4-80GB", 40960, "A100-80GB"),
        # single strategy appends the MIG profile, whose "5gb" is not the card's size
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 40960, "A100-40GB"),
        ("NVIDIA-A100-SXM4-MIG-1g.10gb", 81920, "A100-80GB"),
    ],
)
def test_a_catalogue_model_is_found_from_the_node_labels(product, memory_mib, model):
    assert model_from_node_labels(product, memory_mib) == model
    assert model_info(model).mig is GPU_MODELS[model]


@pytest.mark.parametrize(
    ("product", "memory_mib", "model"),
    [
        ("NVIDIA-L40S", 46068, "L40S-48GB"),  # reports 45 GiB of the 48 GB sold
        ("NVIDIA-L4", 23034, "L4-24GB"),
        ("NVIDIA-A10G", 23028, "A10G-24GB"),
        ("Tesla-T4", 15360, "T4-16GB"),
        ("Tesla-V100-SXM2-32GB", 32768, "V100-32GB"),
        ("NVIDIA-RTX-6000-Ada-Generation", 49140, "RTX-6000-ADA-GENERATION-48GB"),
        # feature discovery marks a time-sliced GPU's product when the resource keeps its name
        ("NVIDIA-L40S-SHARED", 46068, "L40S-48GB"),
        # an A100 of a size the catalogue lacks: its family's geometry is not assumed
        ("NVIDIA-A100-PCIE", 65536, "A100-64GB"),
        # no memory label: the size the product names
        ("NVIDIA-A40-48GB", None, "A40-48GB"),
        # past the sizes sold that the ladder knows: the memory rounded up
        ("NVIDIA-X9000", 400 * 1024 + 10, "X9000-401GB"),
    ],
)
def test_any_other_gpu_is_named_from_its_product_and_memory_and_given_out_whole(product, memory_mib, model):
    assert model_from_node_labels(product, memory_mib) == model
    info = model_info(model)
    assert info.mig is None
    assert info.name == model
    assert f"-{info.memory_gb}GB" in model


@pytest.mark.parametrize(
    ("product", "memory_mib"),
    [
        ("", None),
        ("", 46068),  # no product
        ("NVIDIA", 46068),  # a maker but no model
        ("NVIDIA-H200", None),  # no size anywhere
        ("NVIDIA-L40S", None),
        ("NVIDIA-" + "X" * 40, 46068),  # longer than a GPU row keeps
    ],
)
def test_labels_that_name_no_gpu_are_refused(product, memory_mib):
    with pytest.raises(UnknownGpuModel) as refused:
        model_from_node_labels(product, memory_mib)
    assert "nvidia.com/gpu.product" in str(refused.value)


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("H100-80GB", True),
        ("L40S-48GB", True),
        ("RTX-6000-ADA-48GB", True),
        ("X100", False),
        ("h100-80gb", False),
        ("L40S-48", False),
        ("-48GB", False),
        ("L40S--48GB", False),
        ("A" * (MAX_NAME - 4) + "-48GB", False),
        ("A" * (MAX_NAME - 5) + "-48GB", True),
    ],
)
def test_a_model_name_is_a_family_and_the_memory_sold(name, ok):
    assert is_model_name(name) is ok
    if ok:
        assert model_info(name).name == name
    else:
        with pytest.raises(UnknownGpuModel, match="Unknown GPU model"):
            model_info(name)


def test_only_a_catalogue_model_has_a_geometry_for_mig():
    assert model_info("H100-94GB").geometry() is GPU_MODELS["H100-94GB"]
    with pytest.raises(
        NoGeometry, match="L40S-48GB has no MIG geometry in the catalogue, so MIG cannot be on"
    ):
        model_info("L40S-48GB").geometry()
