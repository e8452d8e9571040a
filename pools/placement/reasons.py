"""Why a request was not placed, in words a tenant can act on: what is missing, and where.

A reason is an English sentence that also keeps its template and values (`Reason`), so
that the portal can show it in the reader's language; the templates are marked with
`gettext_noop` for the translation catalogue, without this pure module importing Django.
"""

from __future__ import annotations

from pools.kinds import WHOLE, compute_slices, kind_of
from pools.mig import COMPUTE_SLICES
from pools.placement.availability import obtainable_in, tally_of_buckets
from pools.placement.index import FleetIndex

Wanted = dict[str, tuple[int, dict[str, int]]]  # model -> (full GPUs, {profile: instances})


def gettext_noop(template: str) -> str:
    """Marks a template for the translation catalogue; translation happens where it is shown."""
    return template


class Reason(str):
    """An English sentence that keeps its template and values (values may be Reasons, or lists of them)."""

    template: str
    params: dict

    def __new__(cls, template: str, **params) -> Reason:
        text = template % {key: _english(value) for key, value in params.items()}
        reason = super().__new__(cls, text)
        reason.template, reason.params = template, params
        return reason

    def as_data(self) -> dict:
        """Plain data to store, for `render` to translate later."""
        return {"template": self.template, "params": {k: _data(v) for k, v in self.params.items()}}


def _english(value):
    return "; ".join(value) if isinstance(value, list) else value


def _data(value):
    if isinstance(value, Reason):
        return value.as_data()
    if isinstance(value, list):
        return [_data(v) for v in value]
    return value


def unplaced_reason(index: FleetIndex, group: str | None, wanted: Wanted, failed: dict[str, str]) -> Reason:
    """`failed` names, per cluster, the first model of the request that the cluster could not take."""
    relevant = [
        cluster
        for cluster in index.clusters()
        if any(index.buckets_for(cluster, model, group) for model in wanted)
    ]
    if not relevant:
        return _no_gpu(next(iter(wanted)), group)
    reasons = [
        (cluster, _model_reason(index, cluster, group, wanted, failed[cluster])) for cluster in relevant
    ]
    if len(reasons) == 1:
        cluster, reason = reasons[0]
        if len(index.clusters()) > 1:
            return Reason(gettext_noop("cluster %(cluster)s: %(reason)s"), cluster=cluster, reason=reason)
        return reason
    listed = [
        Reason(gettext_noop("cluster %(cluster)s: %(reason)s"), cluster=cluster, reason=reason)
        for cluster, reason in reasons
    ]
    return Reason(gettext_noop("no single cluster can take the whole request: %(listed)s"), listed=listed)


def shortfall(index: FleetIndex, cluster: str, group: str | None, wanted: Wanted) -> int:
    """Compute slices of the request that one cluster cannot give now, counted as the reasons count:
    free MIG-disabled and wholly free GPUs go to full GPUs first, the rest to instances, with the free
    instances of GPUs in use. An estimate that ranks clusters by how close they come, not a promise."""
    missing = 0
    for model, (full, parts) in wanted.items():
        buckets = index.buckets_for(cluster, model, group)
        missing += max(0, full - obtainable_in(index, buckets, model, WHOLE.profile)) * COMPUTE_SLICES
        for profile, count in parts.items():
            placeable = obtainable_in(index, buckets, model, profile)
            missing += max(0, count - placeable) * compute_slices(model, profile)
    return missing


def _no_gpu(model: str, group: str | None) -> Reason:
    if group:
        return Reason(gettext_noop("no %(model)s GPU in group %(group)s"), model=model, group=group)
    return Reason(gettext_noop("no %(model)s GPU"), model=model)


def _not_offered(model: str, group: str | None, profile: str) -> Reason:
    if group:
        return Reason(
            gettext_noop("no %(model)s GPU in group %(group)s is offered as %(profile)s"),
            model=model,
            group=group,
            profile=profile,
        )
    return Reason(gettext_noop("no %(model)s GPU is offered as %(profile)s"), model=model, profile=profile)


def _model_reason(index: FleetIndex, cluster: str, group: str | None, wanted: Wanted, model: str) -> Reason:
    buckets = index.buckets_for(cluster, model, group)
    if not buckets:
        return _no_gpu(model, group)
    total = sum(b.total for b in buckets)
    drained = sum(b.drained for b in buckets)
    if drained == total:
        if total == 1:
            if group:
                return Reason(
                    gettext_noop("the one %(model)s GPU in group %(group)s is drained or unhealthy"),
                    model=model,
                    group=group,
                )
            return Reason(gettext_noop("the one %(model)s GPU is drained or unhealthy"), model=model)
        if group:
            return Reason(
                gettext_noop("all %(total)s %(model)s GPUs in group %(group)s are drained or unhealthy"),
                total=total,
                model=model,
                group=group,
            )
        return Reason(
            gettext_noop("all %(total)s %(model)s GPUs are drained or unhealthy"), total=total, model=model
        )
    tally = tally_of_buckets(index, buckets, model)
    blank = tally.blank
    full, parts = wanted[model]
    for profile in [WHOLE.profile] * bool(full) + list(parts):
        if kind_of(profile).offer_of(profile) not in tally.offers:
            return _not_offered(model, group, profile)
    whole = obtainable_in(index, buckets, model, WHOLE.profile)
    if full > whole:
        return Reason(
            gettext_noop("needs %(full)s × full %(model)s; %(blank)s free"),
            full=full,
            model=model,
            blank=whole,
        )
    for profile, count in parts.items():
        placeable = obtainable_in(index, buckets, model, profile)
        if placeable < count:
            return Reason(
                PLACEABLE,
                count=count,
                profile=profile,
                placeable=placeable,
            )
    items = [Reason(gettext_noop("%(count)s × full %(model)s"), count=full, model=model)] if full else []
    items += [
        Reason(gettext_noop("%(count)s × %(profile)s"), count=count, profile=profile)
        for profile, count in parts.items()
    ]
    template = TOGETHER[(bool(group), blank == 1)]
    return Reason(template, items=_and(items), model=model, group=group or "", blank=blank)


def _and(items: list[Reason]) -> Reason:
    """`a and b and c`, each `and` translatable."""
    joined = items[0]
    for item in items[1:]:
        joined = Reason(gettext_noop("%(first)s and %(next)s"), first=joined, next=item)
    return joined


PLACEABLE = gettext_noop(
    "needs %(count)s × %(profile)s; %(placeable)s placeable without re-partitioning in-use GPUs"
)
TOGETHER = {  # (in a group, one wholly free GPU) → template
    (False, False): gettext_noop(
        "needs %(items)s together; the free %(model)s capacity takes each alone "
        "but not all at once (%(blank)s wholly free GPUs, the rest in use)"
    ),
    (False, True): gettext_noop(
        "needs %(items)s together; the free %(model)s capacity takes each alone "
        "but not all at once (%(blank)s wholly free GPU, the rest in use)"
    ),
    (True, False): gettext_noop(
        "needs %(items)s together; the free %(model)s capacity in group %(group)s takes each alone "
        "but not all at once (%(blank)s wholly free GPUs, the rest in use)"
    ),
    (True, True): gettext_noop(
        "needs %(items)s together; the free %(model)s capacity in group %(group)s takes each alone "
        "but not all at once (%(blank)s wholly free GPU, the rest in use)"
    ),
}
