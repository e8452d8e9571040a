"""Factories for tests: `ProjectFactory(tenant=acme)`, `MembershipFactory(role=Role.ADMIN)`,
`PoolFactory(project__tenant=acme, state=PoolState.RELEASED)`.

They make rows a test needs as given state. A test about a transition goes through the services
(`submit_request`, `approve_request`, `admit_waiting`, …) instead, since only they write events.
"""

from datetime import timedelta
from decimal import Decimal
from uuid import uuid4

import factory
from django.contrib.auth import get_user_model
from django.db.backends.postgresql.psycopg_any import NumericRange
from django.db.models import Max
from django.utils import timezone

from pools import mig
from pools.models import Health, PoolState, RequestState, WhatIfState
from pools.specs import parse_spec
from portal.models import Invitation, Membership, Project, Role, Tenant

PASSWORD = "test-password-123"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def save_password(obj, create, extracted, **kwargs):
        if create:
            obj.save()

    @factory.post_generation
    def verified_email(obj, create, extracted, **kwargs):
        """`verified_email=True`: the person has proved their address, as allauth records it."""
        if create and extracted:
            from allauth.account.models import EmailAddress

            EmailAddress.objects.update_or_create(
                user=obj, email=obj.email.lower(), defaults={"verified": True, "primary": True}
            )

    @factory.post_generation
    def totp(obj, create, extracted, **kwargs):
        """Platform staff have TOTP on, as the portal requires; `totp=False` makes one who has not."""
        from allauth.mfa.models import Authenticator

        wanted = extracted if extracted is not None else (obj.is_staff or obj.is_superuser)
        if create and wanted and not Authenticator.objects.filter(user=obj, type="totp").exists():
            enable_totp(obj)


def enable_totp(user) -> str:
    """Turn TOTP on for `user`, as the set-up page would; returns the secret."""
    from allauth.mfa.totp.internal.auth import TOTP, generate_totp_secret

    secret = generate_totp_secret()
    TOTP.activate(user, secret)
    return secret


def totp_code(secret: str, *, periods_ago: int = 0) -> str:
    """The code an authenticator app shows now (or that many periods ago) for `secret`."""
    import time

    from allauth.mfa import app_settings
    from allauth.mfa.totp.internal.auth import format_hotp_value, hotp_value

    counter = int(time.time()) // app_settings.TOTP_PERIOD - periods_ago
    return format_hotp_value(hotp_value(secret, counter))


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        django_get_or_create = ["slug"]

    slug = factory.Sequence(lambda n: f"tenant{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    tenant = factory.SubFactory(TenantFactory)
    slug = factory.Sequence(lambda n: f"project{n}")
    name = factory.LazyAttribute(lambda p: p.slug.title())
    namespace = factory.LazyAttribute(lambda p: Project.default_namespace(p.tenant.slug, p.slug))


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = Role.MEMBER


class InvitationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Invitation

    tenant = factory.SubFactory(TenantFactory)
    email = factory.Sequence(lambda n: f"invitee{n}@example.com")
    role = Role.MEMBER
    invited_by = factory.SubFactory(UserFactory)


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
    resource_name = factory.LazyAttribute(lambda s: mig.resource_name(s.profile))
    capacity = 1
    allocatable = factory.SelfAttribute("capacity")


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
    reserved; any other pool has no `released_at`. Passing `request=` needs `project=request.project`."""

    class Meta:
        model = "pools.Pool"

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

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        if kwargs["request"].project_id != kwargs["project"].pk:
            raise ValueError("A pool belongs to its request's project: pass project=request.project.")
        return super()._create(model_class, *args, **kwargs)


def whatif_report(month: str = "2026-11", *, changed: bool = True, points: int = 4) -> dict:
    """A small report as run_whatif writes it: the real fleet and, with `changed`, a changed one with more
    GPUs, each with a summary and a series of `points` two-hour buckets."""

    def fleet(gpus: int, busy: float) -> dict:
        return {
            "gpus": gpus, "requests": 10, "admitted": 9 if busy > 0.5 else 10,
            "served_slice_hours": round(gpus * 7 * busy * 2 * points, 2),
            "mean_wait_seconds": 5400.0 if busy > 0.5 else 0.0, "p95_wait_seconds": 7200 if busy > 0.5 else 0,
            "stranded": {"min": 0, "mean": 1.5, "max": 3},
            "series": {
                "step_seconds": 7200, "compute_slices": gpus * 7,
                "at": [n * 7200 for n in range(points)],
                "utilisation": [round(busy * (n + 1) / points, 4) for n in range(points)],
                "stranded": [float(n % 3) for n in range(points)],
                "waiting": [round(busy * n, 2) for n in range(points)],
                "mean_wait_seconds": [None if n % 2 else 1800 * n for n in range(points)],
            },
        }  # fmt: skip

    fleets = {"real": fleet(16, 0.8)}
    if changed:
        fleets["changed"] = fleet(24, 0.5)
    changes = ["added 8 × H200-141GB (MIG off) in group training: sim/added-1"] if changed else []
    return {
        "month": month, "time_zone": "Asia/Seoul", "cluster": None, "horizon_seconds": points * 7200,
        "estimated_holds": 1, "changes": changes, "fleets": fleets,
    }  # fmt: skip


class WhatIfRunFactory(factory.django.DjangoModelFactory):
    """A kept what-if run of last November, queued unless `state=` says otherwise: a done one has a small
    report (`whatif_report`), a failed one an error, each started and finished now; its deadline is half an
    hour away. `WhatIfRunFactory(state=WhatIfState.DONE, requested_by=erin)`."""

    class Meta:
        model = "pools.WhatIfRun"

    month = "2026-11"
    changes = factory.LazyFunction(lambda: [["add", "8 H200-141GB training"]])
    state = WhatIfState.QUEUED
    requested_by = factory.SubFactory(UserFactory, is_staff=True)
    deadline = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=30))
    started_at = factory.LazyAttribute(lambda r: None if r.state == WhatIfState.QUEUED else timezone.now())
    finished_at = factory.LazyAttribute(
        lambda r: timezone.now() if r.state in (WhatIfState.DONE, WhatIfState.FAILED) else None
    )
    progress = factory.LazyAttribute(lambda r: 1.0 if r.state == WhatIfState.DONE else 0.0)
    report = factory.LazyAttribute(lambda r: whatif_report(r.month) if r.state == WhatIfState.DONE else None)
    error = factory.LazyAttribute(
        lambda r: "--remove h200-9: the fleet has no node 'h200-9'." if r.state == WhatIfState.FAILED else ""
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
    resource_name = factory.LazyAttribute(lambda a: mig.resource_name(a.profile))
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


class PriceListFactory(factory.django.DjangoModelFactory):
    """`PriceListFactory(name="2027 list")`."""

    class Meta:
        model = "billing.PriceList"
        django_get_or_create = ["name"]

    name = factory.Sequence(lambda n: f"price list {n}")


class PriceFactory(factory.django.DjangoModelFactory):
    """An hourly price of one spec, in force from a day ago until changed:
    `PriceFactory(gpu_model="H100-80GB", profile="1g.10gb", hourly_price=Decimal("600"))`."""

    class Meta:
        model = "billing.Price"

    price_list = factory.SubFactory(PriceListFactory)
    gpu_model = "H100-80GB"
    profile = mig.FULL_GPU
    hourly_price = factory.LazyFunction(lambda: Decimal("4200"))
    valid_from = factory.LazyFunction(lambda: timezone.now() - timedelta(days=1))
    valid_to = None


class InvoiceFactory(factory.django.DjangoModelFactory):
    """A tenant's invoice of a month as given state (usually a month before the one a test closes):
    `InvoiceFactory(tenant=acme, month=date(2026, 10, 1), subtotal=Decimal("10000"), tax=Decimal("1000"))`.
    Issued, paid and void ones get a number and the moments of their state; no lines."""

    class Meta:
        model = "billing.Invoice"

    tenant = factory.SubFactory(TenantFactory)
    month = factory.LazyFunction(lambda: timezone.now().date().replace(day=1))
    state = "draft"
    currency = "KRW"
    tax_rate = Decimal("10")
    subtotal = Decimal("0")
    tax = factory.LazyAttribute(
        lambda invoice: (invoice.subtotal * invoice.tax_rate / 100).quantize(Decimal(1))
    )
    total = factory.LazyAttribute(lambda invoice: invoice.subtotal + invoice.tax)
    # A series of its own, so that it never takes a number `billing.invoices.issue` would give.
    number = factory.LazyAttributeSequence(
        lambda invoice, n: None if invoice.state == "draft" else f"F{invoice.month.year}-{n + 1:05d}"
    )
    issued_at = factory.LazyAttribute(lambda invoice: None if invoice.state == "draft" else timezone.now())
    paid_at = factory.LazyAttribute(lambda invoice: timezone.now() if invoice.state == "paid" else None)
    voided_at = factory.LazyAttribute(lambda invoice: timezone.now() if invoice.state == "void" else None)
    void_reason = factory.LazyAttribute(lambda invoice: "test" if invoice.state == "void" else "")


class AlertRuleFactory(factory.django.DjangoModelFactory):
    """A rule, the default temperature one unless told: `AlertRuleFactory(name="Idle", kind="idle_pool",
    threshold=5)`. Rules are found by name, so the default rules of a fresh database are reused."""

    class Meta:
        model = "monitoring.AlertRule"
        django_get_or_create = ["name"]

    name = "GPU too hot"
    kind = "threshold"
    metric = factory.LazyAttribute(lambda r: "temperature_c" if r.kind == "threshold" else "")
    threshold = factory.LazyAttribute(lambda r: 85.0 if r.kind in ("threshold", "idle_pool") else None)
    duration_seconds = 300


class AlertFactory(factory.django.DjangoModelFactory):
    """An open alert of the temperature rule on a GPU, fired now, as given state:
    `AlertFactory(gpu=gpu, severity="critical", resolved_at=timezone.now())`. Alerts a test is about come
    from `monitoring.alerts.evaluate`."""

    class Meta:
        model = "monitoring.Alert"

    rule = factory.SubFactory(AlertRuleFactory)
    gpu = factory.SubFactory(GpuCapacityFactory)
    slot = -1
    subject = factory.LazyAttribute(lambda a: f"gpu:{a.gpu.pk}")
    message = "temperature (°C) above 85 °C for 5 min: 90.0 °C"
    value = 90.0
    severity = "warning"
    resolved_at = None
    fired_at = factory.LazyAttribute(lambda a: min(timezone.now(), a.resolved_at or timezone.now()))
    last_seen_at = factory.LazyAttribute(lambda a: a.fired_at)
