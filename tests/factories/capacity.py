"""Factories of capacity as the inventory sync records it: clusters, GPU groups, nodes, GPUs (MIG on or
off, with their instances) and the resources nodes advertise."""

from uuid import uuid4

import factory
from django.db.models import Max
from django.utils import timezone

from pools import kinds, mig
from pools.models import Health


class ClusterFactory(factory.django.DjangoModelFactory):
    """A simulated cluster; pass `fleet=[(prefix, count, model, layouts)]` to give it GPUs."""

    class Meta:
        model = "pools.Cluster"
        django_get_or_create = ["name"]
        skip_postgeneration_save = True

    name = factory.Sequence(lambda n: f"cluster{n}")
    driver = "simulated"

    @factory.post_generation
    def fleet(obj, create, extracted, **kwargs):
        if create and extracted is not None:
            from pools.drivers.simulated import fleet_state, seed

            seed(obj, fleet_state(extracted))

    @factory.post_generation
    def kubeconfig(obj, create, extracted, **kwargs):
        """`kubeconfig=text`: the cluster's credentials, stored encrypted as registration stores them."""
        if extracted:
            obj.set_kubeconfig(extracted)
            if create:
                obj.save(update_fields=["kubeconfig_encrypted"])


class GpuGroupFactory(factory.django.DjangoModelFactory):
    """Nodes set aside for a workload type: `GpuGroupFactory(cluster=sim, name="training")`."""

    class Meta:
        model = "pools.GpuGroup"
        django_get_or_create = ["cluster", "name"]

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"group{n}")


class NodeCapacityFactory(factory.django.DjangoModelFactory):
    """A ready GPU node as the inventory sync records it, MIG manager settled; `gpus=8` gives it eight
    GPUs of its model, and `gpus__mig={"1g.18gb": 7}` cuts each of them:
    `NodeCapacityFactory(cluster=sim, gpu_model="H200-141GB", gpus=2)`."""

    class Meta:
        model = "pools.NodeCapacity"
        skip_postgeneration_save = True

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"node{n}")
    gpu_model = "H100-80GB"
    mig_strategy = "mixed"
    mig_state = "success"
    mig_state_since = factory.LazyFunction(timezone.now)

    @factory.post_generation
    def gpus(obj, create, extracted, **kwargs):
        if create and extracted:
            for index in range(extracted):
                GpuCapacityFactory(node=obj, index=index, **kwargs)
            obj.gpu_count = extracted
            obj.save(update_fields=["gpu_count"])


def _next_gpu_index(node) -> int:
    if node.pk is None:
        return 0
    highest = node.gpus.aggregate(highest=Max("index"))["highest"]
    return 0 if highest is None else highest + 1


def _memory_mib(model: str) -> int:
    from pools.drivers.simulated import PRODUCT_LABELS

    return PRODUCT_LABELS[model][1] if model in PRODUCT_LABELS else 0


def _mig_layout(model: str, counts: dict[str, int] | None) -> list[dict]:
    """The instances `counts` places on one GPU of `model`, as the sync stores them."""
    if counts is None:
        return []
    placed = mig.place_profiles(mig.gpu_model(model), counts)
    if placed is None:
        raise ValueError(f"{counts} does not fit on one {model}.")
    return [{"profile": i.profile, "start": i.start, "uuid": f"MIG-{uuid4()}"} for i in sorted(placed)]


class GpuCapacityFactory(factory.django.DjangoModelFactory):
    """A healthy GPU of its node's model with MIG off; `mig={"1g.18gb": 7}` turns MIG on with those
    instances placed as the MIG manager would place them: `GpuCapacityFactory(node=node, mig={"3g.71gb": 2})`.
    Made alone, it gets a node of its own: `GpuCapacityFactory(node__gpu_model="H200-141GB")`."""

    class Meta:
        model = "pools.GpuCapacity"

    class Params:
        mig = None  # {profile: count} with MIG on; None: MIG off

    node = factory.SubFactory(NodeCapacityFactory, gpu_count=1)
    index = factory.LazyAttribute(lambda g: _next_gpu_index(g.node))
    uuid = factory.LazyFunction(lambda: f"GPU-{uuid4()}")
    model = factory.LazyAttribute(lambda g: g.node.gpu_model)
    memory_mib = factory.LazyAttribute(lambda g: _memory_mib(g.model))
    mig_capable = True
    mig_enabled = factory.LazyAttribute(lambda g: g.mig is not None)
    layout = factory.LazyAttribute(lambda g: _mig_layout(g.model, g.mig))
    health = Health.OK


class SpecAndCountFactory(factory.django.DjangoModelFactory):
    """How many of one resource a node advertises: `SpecAndCountFactory(node=node, profile="1g.18gb",
    capacity=7)`; all of it allocatable, none allocated to pools."""

    class Meta:
        model = "pools.SpecAndCount"

    node = factory.SubFactory(NodeCapacityFactory)
    profile = mig.FULL_GPU
    resource_name = factory.LazyAttribute(lambda s: kinds.resource_name(s.profile))
    capacity = 1
    allocatable = factory.SelfAttribute("capacity")
