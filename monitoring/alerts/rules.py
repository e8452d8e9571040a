"""What each kind of alert rule watches, asked of storage in SQL: one check per kind, in a registry. What
a check reads of pools (the GPUs where they are, the allocations billed now) is pools' own relations
(pools/selectors/monitoring.py), joined in the same query.

Words:
- subject: what an alert is about, as a key — `gpu:12`, `gpu:12:4` (a MIG instance: GPU and first memory
  slice), `node:3`, `agent:5`, `pool:9`. A rule has at most one open alert per subject.
- finding: a subject for which the rule's condition holds now, with what evaluation writes on its alert.
- cleared: the open alerts' subjects for which the condition is known to be over, so they resolve.
  An open alert whose subject is in neither keeps its state: no news is not good news.

A check is `check(rule, now=…, open=…) -> Verdict`, `open` being the rule's open alerts by subject.
What holds and what clears, kind by kind:
- threshold: the subject's samples cover the last `duration` and every one crosses the level. Covering,
  with G = MONITORING_ALERT_SAMPLE_GAP_SECONDS: samples from G before the window's start are read, the
  first is at or before the start, the last within G of now, and no two follow more than G apart.
  Cleared once the subject's newest figure no longer crosses.
- ecc, xid: an event newer than the last one the subject's alerts of this rule have seen. Cleared once
  `duration` has passed since the alert fired and since its newest event.
- silent_node: a node that has reported figures, but none in the last `duration`. Cleared by a newer one.
- silent_agent: an agent token used before, not in the last `duration`, and not revoked.
- trespass: a GPU in use by a namespace that holds no allocation on it, seen by the cluster's syncs
  (pools/services/trespasses.py) for at least `duration`. Cleared once a sync no longer sees it.
- idle_pool: an active pool whose every live allocation's SM activity stayed under the level for the
  last `duration`, covered as for thresholds (an allocation younger than that is not idle yet); idle since
  the window's start. Cleared once the pool is no longer active, or an allocation's newest figure reaches
  the level. An open alert is the pool's idle spell, which its people are told of
  (monitoring/notifications/recording.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection
from django.utils.translation import gettext as _

from monitoring.conf import settings
from monitoring.faults.services import FAULT_XIDS
from monitoring.models import AgentToken
from monitoring.models.alerts import MEMORY_USED_PCT, Alert, AlertRule, Comparison, RuleKind, Scope, Severity
from monitoring.models.samples import METRICS, WHOLE_GPU, GpuEvent
from pools.selectors import monitoring as pools


@dataclass(frozen=True)
class Finding:
    subject: str
    message: str
    value: float | None
    seen_at: datetime  # when the condition was last seen holding: now, or the newest event's time
    gpu_id: int | None = None
    slot: int | None = None
    node_id: int | None = None
    pool_id: int | None = None
    agent_token_id: int | None = None
    severity: str | None = None  # None: the rule's
    since: datetime | None = None  # when the condition began, where the rule knows it


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)
    cleared: set[str] = field(default_factory=set)


Check = Callable[..., Verdict]
CHECKS: dict[str, Check] = {}


def register(kind: str) -> Callable[[Check], Check]:
    def add(check: Check) -> Check:
        CHECKS[kind] = check
        return check

    return add


def _rows(sql: str, params: dict) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _gap() -> timedelta:
    return timedelta(seconds=settings.MONITORING_ALERT_SAMPLE_GAP_SECONDS)


# --- thresholds ----------------------------------------------------------------------------------

# The SQL of each figure a rule may watch; only these names ever reach a query.
FIGURES = {
    **{metric: metric for metric in METRICS},
    MEMORY_USED_PCT: "100.0 * memory_used_bytes / NULLIF(memory_total_bytes, 0)",
}
UNITS = {
    "power_w": " W",
    "temperature_c": " °C",
    "utilisation_pct": " %",
    "sm_active_pct": " %",
    "memory_used_bytes": " B",
    MEMORY_USED_PCT: " %",
}


def _crosses(rule: AlertRule, value: str) -> str:
    return f"{value} > %(level)s" if rule.comparison == Comparison.ABOVE else f"{value} < %(level)s"


def gpu_subject(gpu_id: int, slot: int) -> str:
    return f"gpu:{gpu_id}" if slot < 0 else f"gpu:{gpu_id}:{slot}"


def _parse_gpu_subject(subject: str) -> tuple[int, int]:
    parts = subject.split(":")
    return int(parts[1]), int(parts[2]) if len(parts) > 2 else -1


@register(RuleKind.THRESHOLD)
def threshold(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    figure = FIGURES[rule.metric]
    slots = "slot = -1" if rule.scope == Scope.GPU else "slot >= 0"
    start = now - timedelta(seconds=rule.duration_seconds)
    params = {"start": start, "now": now, "level": rule.threshold, "gap": _gap()}
    held = _rows(
        f"""
        SELECT gpu_id, slot, (array_agg(v ORDER BY at DESC))[1]
        FROM (
            SELECT gpu_id, slot, at, v, at - lag(at) OVER (PARTITION BY gpu_id, slot ORDER BY at) AS gap
            FROM (SELECT gpu_id, slot, at, {figure} AS v FROM monitoring_sample
                  WHERE at >= %(start)s - %(gap)s AND at <= %(now)s AND {slots}) AS figures
            WHERE v IS NOT NULL
        ) AS s
        GROUP BY gpu_id, slot
        HAVING bool_and({_crosses(rule, "v")})
           AND min(at) <= %(start)s AND max(at) >= %(now)s - %(gap)s
           AND COALESCE(max(gap), interval '0') <= %(gap)s
        """,
        params,
    )
    label = dict(rule._meta.get_field("metric").choices)[rule.metric]
    side = _("above") if rule.comparison == Comparison.ABOVE else _("below")
    verdict = Verdict()
    for gpu_id, slot, value in held:
        message = _("%(figure)s %(side)s %(level)s%(unit)s for %(minutes)s min: %(value).1f%(unit)s") % {
            "figure": label,
            "side": side,
            "level": f"{rule.threshold:g}",
            "unit": UNITS[rule.metric],
            "minutes": f"{rule.duration_seconds / 60:g}",
            "value": value,
        }
        verdict.findings.append(
            Finding(gpu_subject(gpu_id, slot), message, value, now, gpu_id=gpu_id, slot=slot)
        )
    holding = {f.subject for f in verdict.findings}
    pairs = [_parse_gpu_subject(subject) for subject in open if subject not in holding]
    if pairs:
        # Over once the newest figure no longer crosses; a GPU that left the inventory is over too.
        inventory = pools.gpus()
        verdict.cleared = {
            gpu_subject(gpu_id, slot)
            for gpu_id, slot in _rows(
                f"""
                SELECT p.gpu_id, p.slot
                FROM unnest(%(gpus)s::bigint[], %(slots)s::smallint[]) AS p(gpu_id, slot)
                LEFT JOIN ({inventory.sql}) g ON g.gpu_id = p.gpu_id
                LEFT JOIN (SELECT gpu_id, slot, {figure} AS v FROM monitoring_latest) l
                       ON l.gpu_id = p.gpu_id AND l.slot = p.slot
                WHERE g.gpu_id IS NULL OR NOT g.present
                   OR (l.v IS NOT NULL AND NOT ({_crosses(rule, "l.v")}))
                """,
                {
                    **inventory.params,
                    "gpus": [g for g, _s in pairs],
                    "slots": [s for _g, s in pairs],
                    "level": rule.threshold,
                },
            )
        }
    return verdict


# --- events --------------------------------------------------------------------------------------


def _events(rule: AlertRule, kind: str, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    """GPUs with events newer than what this rule's alerts of them have seen (an agent may deliver an
    event late, up to MONITORING_SAMPLE_MAX_AGE_SECONDS after it happened)."""
    lookback = max(rule.duration_seconds, settings.MONITORING_SAMPLE_MAX_AGE_SECONDS)
    inventory = pools.gpus()
    news = _rows(
        f"""
        SELECT e.gpu_id, max(e.at), count(*), (array_agg(e.code ORDER BY e.at DESC, e.id DESC))[1],
               bool_or(e.code = ANY(%(fatal)s)), g.node_id
        FROM monitoring_gpuevent e
        JOIN ({inventory.sql}) g ON g.gpu_id = e.gpu_id
        LEFT JOIN (SELECT gpu_id, max(last_seen_at) AS seen FROM monitoring_alert
                   WHERE rule_id = %(rule)s AND gpu_id IS NOT NULL GROUP BY gpu_id) a ON a.gpu_id = e.gpu_id
        WHERE e.kind = %(kind)s AND e.at > %(since)s AND e.at <= %(now)s AND (a.seen IS NULL OR e.at > a.seen)
        GROUP BY e.gpu_id, g.node_id
        """,
        {
            **inventory.params,
            "fatal": sorted(FAULT_XIDS),
            "rule": rule.pk,
            "kind": kind,
            "since": now - timedelta(seconds=lookback),
            "now": now,
        },
    )
    verdict = Verdict()
    for gpu_id, at, count, code, fatal, node_id in news:
        if kind == GpuEvent.Kind.XID:
            message = _("XID %(code)s on the GPU (%(count)d new event(s))") % {"code": code, "count": count}
            severity = Severity.CRITICAL if fatal else None
        else:
            message = _("Uncorrected ECC errors on the GPU: %(code)s") % {"code": code}
            severity = None
        verdict.findings.append(
            Finding(
                gpu_subject(gpu_id, -1),
                message,
                code,
                at,
                gpu_id=gpu_id,
                slot=-1,
                node_id=node_id,
                severity=severity,
            )
        )
    quiet_since = now - timedelta(seconds=rule.duration_seconds)
    holding = {f.subject for f in verdict.findings}
    verdict.cleared = {
        subject
        for subject, alert in open.items()
        if subject not in holding and max(alert.last_seen_at, alert.fired_at) <= quiet_since
    }
    return verdict


@register(RuleKind.ECC)
def ecc(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    return _events(rule, GpuEvent.Kind.ECC, now=now, open=open)


@register(RuleKind.XID)
def xid(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    return _events(rule, GpuEvent.Kind.XID, now=now, open=open)


# --- silence -------------------------------------------------------------------------------------


def _silent_for(now: datetime, last: datetime) -> str:
    return _("%(minutes)d min") % {"minutes": (now - last).total_seconds() // 60}


@register(RuleKind.SILENT_NODE)
def silent_node(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    since = now - timedelta(seconds=rule.duration_seconds)
    inventory = pools.gpus()
    nodes = _rows(
        f"""
        SELECT g.node_id, g.cluster_name || '/' || g.node_name, max(l.at)
        FROM ({inventory.sql}) g
        JOIN monitoring_latest l ON l.gpu_id = g.gpu_id
        WHERE g.node_present
        GROUP BY g.node_id, g.cluster_name, g.node_name
        HAVING max(l.at) < %(since)s
        """,
        {**inventory.params, "since": since},
    )
    verdict = Verdict()
    for node_id, name, last in nodes:
        message = _("Node %(node)s has sent no GPU figures for %(silent)s") % {
            "node": name,
            "silent": _silent_for(now, last),
        }
        verdict.findings.append(
            Finding(f"node:{node_id}", message, (now - last).total_seconds(), now, node_id=node_id)
        )
    silent = {f.subject for f in verdict.findings}
    verdict.cleared = {s for s in open if s not in silent}  # reports again, or left the cluster
    return verdict


@register(RuleKind.SILENT_AGENT)
def silent_agent(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    since = now - timedelta(seconds=rule.duration_seconds)
    silent = AgentToken.objects.filter(
        revoked_at__isnull=True, last_used_at__isnull=False, last_used_at__lt=since
    ).select_related("cluster")
    verdict = Verdict()
    for token in silent:
        message = _("Agent %(agent)s (last from %(host)s) has not reported for %(silent)s") % {
            "agent": f"{token.cluster.name}: {token.name}",
            "host": token.last_host or "?",
            "silent": _silent_for(now, token.last_used_at),
        }
        verdict.findings.append(
            Finding(
                f"agent:{token.pk}",
                message,
                (now - token.last_used_at).total_seconds(),
                now,
                agent_token_id=token.pk,
            )
        )
    holding = {f.subject for f in verdict.findings}
    verdict.cleared = {s for s in open if s not in holding}  # reported again, revoked or deleted
    return verdict


@register(RuleKind.TRESPASS)
def trespass(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    since = now - timedelta(seconds=rule.duration_seconds)
    found = pools.open_trespasses()
    verdict = Verdict()
    for row in found:
        if row.first_seen_at > since:
            continue
        values = {
            "namespace": row.namespace,
            "node": f"{row.cluster.name}/{row.node.name if row.node else '?'}",
            "users": row.users,
        }
        if row.device_uuid:
            message = _(
                "Namespace %(namespace)s holds device %(uuid)s on %(node)s, which no pool of its own holds "
                "(%(users)s)"
            )
            values["uuid"] = row.device_uuid
        else:
            message = _(
                "Namespace %(namespace)s uses %(count)s × %(resource)s on %(node)s beyond what its pools "
                "hold there (%(users)s)"
            )
            values.update(count=row.count, resource=row.resource_name)
        verdict.findings.append(
            Finding(
                f"trespass:{row.pk}",
                message % values,
                float(row.count),
                now,
                node_id=row.node_id,
                pool_id=row.pool_id,
                since=row.first_seen_at,
            )
        )
    still = {f"trespass:{row.pk}" for row in found}
    verdict.cleared = {s for s in open if s not in still}
    return verdict


# --- idle pools ----------------------------------------------------------------------------------


def _billed() -> tuple[str, dict]:
    """The live allocations of active pools, those billed now, each with its sample slot: pools' own
    relation, as a CTE's body, and its parameters."""
    billed = pools.allocations(active_pools=True)
    return f"SELECT a.*, COALESCE(a.start, {WHOLE_GPU}) AS slot FROM ({billed.sql}) a", billed.params


@register(RuleKind.IDLE_POOL)
def idle_pool(rule: AlertRule, *, now: datetime, open: dict[str, Alert]) -> Verdict:
    start = now - timedelta(seconds=rule.duration_seconds)
    live, params = _billed()
    params = {**params, "start": start, "now": now, "level": rule.threshold, "gap": _gap()}
    idle = _rows(
        f"""
        WITH live AS ({live}),
        figures AS (
            SELECT l.id, s.at, s.sm_active_pct AS v,
                   s.at - lag(s.at) OVER (PARTITION BY l.id ORDER BY s.at) AS gap
            FROM live l JOIN monitoring_sample s
              ON s.gpu_id = l.gpu_id AND s.slot = l.slot
             AND s.at >= GREATEST(%(start)s - %(gap)s, l.allocated_at) AND s.at <= %(now)s
            WHERE s.at >= %(start)s - %(gap)s AND s.at <= %(now)s AND s.sm_active_pct IS NOT NULL
        ),
        per_allocation AS (
            SELECT id, bool_and(v < %(level)s)
                       AND min(at) <= %(start)s AND max(at) >= %(now)s - %(gap)s
                       AND COALESCE(max(gap), interval '0') <= %(gap)s AS idle,
                   max(v) AS peak
            FROM figures GROUP BY id
        )
        SELECT l.pool_id, max(p.peak), count(*)
        FROM live l LEFT JOIN per_allocation p ON p.id = l.id
        GROUP BY l.pool_id
        HAVING bool_and(COALESCE(p.idle, false))
        ORDER BY l.pool_id
        """,
        params,
    )
    verdict = Verdict()
    for pool_id, peak, allocations in idle:
        message = _(
            "Pool #%(pool)s is billed but idle: SM activity under %(level)s %% on all its %(count)d "
            "allocation(s) for %(minutes)s min (at most %(peak).1f %%)"
        ) % {
            "pool": pool_id,
            "level": f"{rule.threshold:g}",
            "count": allocations,
            "minutes": f"{rule.duration_seconds / 60:g}",
            "peak": peak,
        }
        verdict.findings.append(Finding(f"pool:{pool_id}", message, peak, now, pool_id=pool_id, since=start))
    holding = {f.subject for f in verdict.findings}
    waiting = [int(s.split(":")[1]) for s in open if s not in holding]
    if waiting:
        # Still idle as far as the newest figures tell: every live allocation's newest one under the level.
        still = _rows(
            f"""
            WITH live AS ({live})
            SELECT l.pool_id FROM live l
            LEFT JOIN monitoring_latest m ON m.gpu_id = l.gpu_id AND m.slot = l.slot
            WHERE l.pool_id = ANY(%(pools)s)
            GROUP BY l.pool_id
            HAVING bool_and(m.sm_active_pct IS NULL OR m.sm_active_pct < %(level)s)
            """,
            {**params, "pools": waiting},
        )
        verdict.cleared = {f"pool:{pool}" for pool in waiting} - {f"pool:{pool}" for (pool,) in still}
    return verdict
