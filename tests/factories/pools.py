"""Factories of requests, pools and allocations as given state: `PoolFactory(project__tenant=acme)`,
`AllocationFactory(pool=pool, gpu=gpu, profile="3g.71gb")`."""

from datetime import timedelta

import factory
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.utils import timezone

from pools import kinds, mig
from pools.models import PoolItem, PoolState, RequestState
from pools.specs import parse_spec
from tests.factories.capacity import ClusterFactory, GpuCapacityFactory
from tests.factories.tenancy import ProjectFactory, UserFactory

APPROVED_STATES = {RequestState.APPROVED, RequestState.QUEUED, RequestState.FULFILLED}
DEFAULT_ITEMS = [("h100-80gb.full", 1)]


class PoolRequestFactory(factory.django.DjangoModelFactory):
    """A project's request, submitted unless `state=` says otherwise, for one full H100 unless `items=`
    lists (spec id, count) pairs as `submit_request` takes them:
    `PoolRequestFactory(project=vision, state=RequestState.QUEUED, items=[("h200-141gb.mig-1g.18gb", 2)])`.
    An approved, queued or fulfilled request was approved now, a rejected one decided now; who decided
    stays empty unless `decided_by=` names them."""

    class Meta:
        model = "pools.PoolRequest"
        skip_postgeneration_save = True

    project = factory.SubFactory(ProjectFactory)
    submitted_by = factory.SubFactory(UserFactory)
    state = RequestState.SUBMITTED
    approved_at = factory.LazyAttribute(lambda r: timezone.now() if r.state in APPROVED_STATES else None)
    decided_at = factory.LazyAttribute(
        lambda r: r.approved_at or (timezone.now() if r.state == RequestState.REJECTED else None)
    )

    @factory.post_generation
    def items(obj, create, extracted, **kwargs):
        if create:
            for spec_id, count in DEFAULT_ITEMS if extracted is None else extracted:
                RequestItemFactory(request=obj, spec=spec_id, count=count)


class RequestItemFactory(factory.django.DjangoModelFactory):
    """One line of a request, named by its spec id: `RequestItemFactory(request=r, spec="h100-80gb.full")`."""

    class Meta:
        model = "pools.RequestItem"

    class Params:
        spec = DEFAULT_ITEMS[0][0]

    request = factory.SubFactory(PoolRequestFactory, items=[])
    gpu_model = factory.LazyAttribute(lambda i: parse_spec(i.spec).gpu_model)
    profile = factory.LazyAttribute(lambda i: parse_spec(i.spec).profile)
    count = 1


ENDED_STATES = {PoolState.RELEASED, PoolState.FAILED}


class PoolFactory(factory.django.DjangoModelFactory):
    """An active pool of its own fulfilled request, reserved (billed from) now:
    `PoolFactory(project__tenant=acme)`,
    `PoolFactory(project=vision, state=PoolState.RELEASED, reserved_at=t0, released_at=t1)`.
    A released or failed pool was released now, or at `released_at=` if given, never before it was
    reserved; any other pool has no `released_at`; a reclaiming one is under notice. Passing `request=`
    needs `project=request.project`. It holds its request's items by design (its PoolItems); with
    `allocated=True` it holds them for real too, each instance on a new GPU of its cluster, reserved with
    the pool (and released with it), as admission reserves them: what billing meters."""

    class Meta:
        model = "pools.Pool"
        skip_postgeneration_save = True

    project = factory.SubFactory(ProjectFactory)
    request = factory.SubFactory(
        PoolRequestFactory, project=factory.SelfAttribute("..project"), state=RequestState.FULFILLED
    )
    cluster = factory.SubFactory(ClusterFactory)
    state = PoolState.ACTIVE
    reserved_at = factory.LazyFunction(timezone.now)
    active_at = factory.LazyAttribute(
        lambda p: p.reserved_at if p.state not in (PoolState.PROVISIONING, PoolState.FAILED) else None
    )
    released_at = factory.LazyAttribute(
        lambda p: max(p.reserved_at, timezone.now()) if p.state in ENDED_STATES else None
    )
    failure_reason = factory.LazyAttribute(
        lambda p: "the GPU Operator failed to apply the MIG config" if p.state == PoolState.FAILED else ""
    )
    # A reclaiming pool's notice ends a quarter of an hour from now.
    reclaim_at = factory.LazyAttribute(
        lambda p: timezone.now() + timedelta(minutes=15) if p.state == PoolState.RECLAIMING else None
    )

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        if kwargs["request"].project_id != kwargs["project"].pk:
            raise ValueError("A pool belongs to its request's project: pass project=request.project.")
        return super()._create(model_class, *args, **kwargs)

    @factory.post_generation
    def items(obj, create, extracted, **kwargs):
        if create:
            PoolItem.objects.bulk_create(
                PoolItem(pool=obj, gpu_model=i.gpu_model, profile=i.profile, count=i.count)
                for i in obj.request.items.all()
            )

    @factory.post_generation
    def allocated(obj, create, extracted, **kwargs):
        if not (create and extracted):
            return
        for item in obj.request.items.all():
            for _n in range(item.count):
                gpu = GpuCapacityFactory(
                    node__cluster=obj.cluster,
                    node__gpu_model=item.gpu_model,
                    mig=None if item.profile == mig.FULL_GPU else {item.profile: 1},
                )
                AllocationFactory(
                    pool=obj, gpu=gpu, profile=item.profile, allocated_at=obj.reserved_at, request=obj.request
                )


def _gpu_model_offering(profile: str) -> str:
    """The GPU model a new GPU for `profile` gets: an H100 where it has the profile."""
    offering = [name for name, model in mig.GPU_MODELS.items() if profile in model.profiles]
    if profile == mig.FULL_GPU or "H100-80GB" in offering:
        return "H100-80GB"
    if not offering:
        raise ValueError(f"No GPU model has the MIG profile {profile!r}.")
    return offering[0]


def _free_slices(gpu, profile: str, *, live: bool) -> tuple[NumericRange, str]:
    """The first memory slices `profile` may take on `gpu` that no live allocation holds, with the UUID
    of the instance (or GPU) there. A MIG instance is one of the GPU's layout or planned layout, or,
    where it has neither, one at a start the catalogue allows."""
    taken = list(gpu.allocations.filter(released_at=None).values_list("slices", flat=True)) if live else []
    if profile == mig.FULL_GPU:
        candidates = [(0, mig.MEMORY_SLICES, gpu.uuid)]
    else:
        size = mig.gpu_model(gpu.model).profile(profile).memory_slices
        instances = [*gpu.layout, *(gpu.planned_layout or {}).get("instances", [])]
        starts = [(i["start"], i.get("uuid", "")) for i in instances if i["profile"] == profile]
        if not instances:
            starts = [(start, "") for start in mig.gpu_model(gpu.model).profile(profile).starts]
        candidates = [(start, start + size, instance) for start, instance in starts]
    for lower, upper, instance in candidates:
        if all(upper <= t.lower or lower >= t.upper for t in taken):
            return NumericRange(lower, upper), instance
    raise ValueError(f"No free {profile} on GPU {gpu}; pass slices= to take held ones on purpose.")


class AllocationFactory(factory.django.DjangoModelFactory):
    """One full GPU (or MIG instance, `profile="1g.18gb"`) of a pool, on memory slices no live allocation
    of that GPU holds, so that two of them never meet the database's exclusion constraint:
    `AllocationFactory(pool=pool, gpu=gpu, profile="3g.71gb")` takes the GPU's first free 3g.71gb instance.
    Without `gpu=` a new GPU of the pool's cluster is made for it (an H100 where it has the profile);
    without `pool=` an active pool on the GPU's cluster. A released or failed pool's allocations are
    released with it. `slices=NumericRange(0, 8)` takes exactly those slices, free or not.
    SpecAndCount's `allocated` is not recounted."""

    class Meta:
        model = "pools.Allocation"

    gpu = None  # made in _create, once the pool and profile are known
    pool = factory.Maybe(
        "gpu",
        yes_declaration=factory.SubFactory(PoolFactory, cluster=factory.SelfAttribute("..gpu.node.cluster")),
        no_declaration=factory.SubFactory(PoolFactory),
    )
    profile = mig.FULL_GPU
    slices = None  # the first free ones, chosen in _create
    resource_name = factory.LazyAttribute(lambda a: kinds.resource_name(a.profile))
    released_at = factory.LazyAttribute(lambda a: a.pool.released_at)

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        pool, profile = kwargs["pool"], kwargs["profile"]
        if kwargs["gpu"] is None:
            kwargs["gpu"] = GpuCapacityFactory(
                node__cluster=pool.cluster,
                node__gpu_model=_gpu_model_offering(profile),
                mig=None if profile == mig.FULL_GPU else {profile: 1},
            )
        elif kwargs["gpu"].node.cluster_id != pool.cluster_id:
            raise ValueError("An allocation's GPU must be in its pool's cluster.")
        if kwargs["slices"] is None:
            live = kwargs["released_at"] is None
            kwargs["slices"], found = _free_slices(kwargs["gpu"], profile, live=live)
            kwargs.setdefault("instance_uuid", found)
        return super()._create(model_class, *args, **kwargs)
