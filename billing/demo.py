"""Demo data of billing: a price list for every spec (a MIG instance priced by its share of the GPU),
the tenants' billing profiles, and two months of history to look at.

History. The two previous complete calendar months (in BILLING_TIME_ZONE) get pools of both demo
tenants that were asked for, approved by `carol`, reserved on the simulated fleet and released, all
in the past: their rows say what the services would have written then (states, timestamps, events,
allocations on the GPUs and MIG instances the fleet has), and none of them holds capacity now.
Every period of those months is then metered by metering's own `meter_periods` (in transactions of
a bounded size, whatever the period's length), so that the beat carries on from the end of last
month; the month before last is closed and invoiced (acme's invoice paid, globex's left issued) and
last month closed into drafts.
History is made once, and only while nothing in those months is metered or invoiced yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from fractions import Fraction
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.db.models import Min
from django.utils import timezone

from billing import invoicing, mail, metering
from billing.conf import settings
from billing.finance import shift
from billing.invoices import close_month, issue, mark_paid
from billing.models import BillingProfile, Invoice, InvoiceMail, MeteredPeriod, PriceList
from billing.prices import metered_until
from billing.selectors import this_month
from billing.services import add_price, first_unmetered, meter_periods
from pools import kinds, mig
from pools.models import Pool
from pools.services import history
from pools.specs import specs_of
from portal.models import Project, Tenant

LIST_NAME = "Standard"
# Hourly price of a whole GPU in the demo's currency (KRW); an instance pays its compute slices' share.
FULL_GPU_HOURLY = {
    "A100-40GB": Decimal("2100"),
    "A100-80GB": Decimal("2800"),
    "H100-80GB": Decimal("4200"),
    "H200-141GB": Decimal("5600"),
    "B200-180GB": Decimal("8400"),
    "L40S-48GB": Decimal("1400"),
}
APPROVER = "carol"
# Who each demo tenant's invoices go to; acme is billed through its Korean subsidiary.
PROFILES = {
    "acme": {
        "legal_name": "에이크미코리아 주식회사",
        "address": "06236 서울특별시 강남구 테헤란로 152, 21층",
        "tax_id": "120-88-01234",
        "cost_centre": "KR-AI-3100",
        "po_number": "PO-2026-0417",
        "contact_email": "billing@acme.example",
    },
    "globex": {
        "legal_name": "Globex Corporation",
        "address": "1 Globex Plaza\nCypress Creek, OR 97401\nUnited States",
        "tax_id": "94-1234567",
        "cost_centre": "CC-4410 Data Science",
        "po_number": "4500071234",
        "contact_email": "accounts.payable@globex.example",
    },
}


@dataclass(frozen=True)
class DemoPool:
    """A pool of the history: asked for by `who` in a project, reserved on `day` of its month (0: the
    month before last, 1: last month) at `hour` local time, and released `hours` later."""

    project: str
    who: str
    items: tuple[tuple[str, int], ...]
    purpose: str
    month: int
    day: int
    hour: int
    hours: int
    justification: str


PAST_POOLS = (
    DemoPool("vision", "bob", (("h200-141gb.full", 8),), "training", 0, 2, 9, 52,
             "Pre-training the detector backbone on the full data set."),
    DemoPool("recsys", "mallory", (("a100-80gb.full", 4),), "training", 0, 2, 10, 48,
             "Monthly retraining of the recommender."),
    DemoPool("llm-serving", "alice", (("h200-141gb.mig-3g.71gb", 2), ("h200-141gb.mig-1g.18gb", 2)),
             "inference", 0, 9, 10, 60, "Load test of the chat model before its launch."),
    DemoPool("analytics", "mallory", (("h100-80gb.mig-1g.10gb", 3),), "development", 0, 10, 9, 9,
             "Notebooks for the quarterly churn analysis."),
    DemoPool("analytics", "mallory", (("h100-80gb.mig-2g.20gb", 2),), "development", 0, 10, 10, 30,
             "Feature exploration for the pricing model."),
    DemoPool("vision", "alice", (("h200-141gb.mig-1g.18gb", 3),), "inference", 0, 11, 13, 5,
             "Comparing the detector's quantised variants."),
    DemoPool("vision", "bob", (("h200-141gb.full", 2),), "training", 0, 19, 8, 20,
             "Fine-tuning on the newly labelled images."),
    DemoPool("recsys", "mallory", (("a100-80gb.full", 8),), "training", 0, 19, 9, 40,
             "Hyper-parameter sweep of the ranking model."),
    DemoPool("analytics", "mallory", (("h100-80gb.full", 1),), "development", 0, 28, 10, 90,
             "Profiling the feature pipeline across the month end."),
    DemoPool("llm-serving", "alice", (("h200-141gb.mig-4g.71gb", 1), ("h200-141gb.mig-2g.35gb", 1)),
             "inference", 0, 28, 20, 80, "Canary of the next model version, kept over the month end."),
    DemoPool("vision", "bob", (("h200-141gb.full", 4),), "training", 1, 4, 7, 30,
             "Re-training after the annotation fixes."),
    DemoPool("recsys", "mallory", (("a100-80gb.full", 4),), "training", 1, 4, 8, 26,
             "Monthly retraining of the recommender."),
    DemoPool("llm-serving", "alice", (("h200-141gb.mig-3g.71gb", 1),), "inference", 1, 11, 11, 50,
             "Serving the summariser to the pilot customers."),
    DemoPool("analytics", "mallory", (("h100-80gb.mig-1g.10gb", 2), ("h100-80gb.mig-2g.20gb", 1)),
             "development", 1, 12, 9, 12, "Dashboards of the marketing campaign."),
    DemoPool("vision", "alice", (("h200-141gb.mig-1g.18gb", 4), ("h200-141gb.mig-2g.35gb", 2)),
             "inference", 1, 12, 15, 4, "Batch inference over the image archive."),
    DemoPool("vision", "bob", (("h200-141gb.full", 8),), "training", 1, 21, 20, 48,
             "Training the segmentation head."),
    DemoPool("recsys", "mallory", (("a100-80gb.full", 2),), "training", 1, 22, 12, 20,
             "Distilling the ranking model."),
    DemoPool("analytics", "mallory", (("h100-80gb.mig-1g.10gb", 4),), "development", 1, 23, 13, 3,
             "Workshop notebooks for new analysts."),
)  # fmt: skip


def share_price(gpu_model: str, profile: str) -> Decimal:
    full = FULL_GPU_HOURLY[gpu_model]
    compute = Fraction(kinds.compute_slices(gpu_model, profile))
    price = full * compute.numerator / compute.denominator / mig.COMPUTE_SLICES
    return price.quantize(Decimal("1"), rounding=ROUND_HALF_UP)


def load(stdout) -> None:
    made = [_prices(), _profiles(), _history(now=timezone.now())]
    stdout.write("Billing: " + ("; ".join(part for part in made if part) or "already there") + ".")


def _prices() -> str:
    price_list, created = PriceList.objects.get_or_create(
        name=LIST_NAME, defaults={"description": "Demo prices: a MIG instance costs its share of the GPU."}
    )
    if not created or price_list.prices.exists():
        return ""
    since = datetime(2026, 1, 1, tzinfo=ZoneInfo(settings.BILLING_TIME_ZONE))
    specs = specs_of(list(FULL_GPU_HOURLY))
    for spec in specs:
        add_price(
            price_list=price_list,
            gpu_model=spec.gpu_model,
            profile=spec.profile,
            hourly_price=share_price(spec.gpu_model, spec.profile),
            valid_from=since,
        )
    return f"price list {LIST_NAME} ({len(specs)} prices in {settings.BILLING_CURRENCY})"


def _profiles() -> str:
    made = []
    for tenant in Tenant.objects.filter(slug__in=PROFILES).order_by("slug"):
        _profile, created = BillingProfile.objects.get_or_create(
            tenant=tenant, defaults=PROFILES[tenant.slug]
        )
        if created:
            made.append(tenant.slug)
    return f"billing profiles of {', '.join(made)}" if made else ""


def history_months(now: datetime) -> tuple[date, date]:
    """The month before last and last month (their first days): the two previous complete calendar
    months in the billing time zone."""
    last = shift(this_month(now), -1)
    return shift(last, -1), last


def _span(month: date) -> tuple[datetime, datetime]:
    return invoicing.month_span(month.year, month.month, settings.BILLING_TIME_ZONE)


def _history(*, now: datetime) -> str:
    months = history_months(now)
    begins, ends = _span(months[0])[0], _span(months[1])[1]
    period = settings.METERING_PERIOD_SECONDS
    first = metering.period_start(metering.whole_seconds(begins), period)
    touched = (
        MeteredPeriod.objects.filter(start__gte=metering.moment(first), start__lt=ends).exists()
        or Invoice.objects.filter(month__in=months).exists()
    )
    names, slugs = {APPROVER, *(p.who for p in PAST_POOLS)}, {p.project for p in PAST_POOLS}
    people = {u.username: u for u in get_user_model().objects.filter(username__in=names)}
    projects = {p.slug: p for p in Project.objects.filter(slug__in=slugs, tenant__slug__in=PROFILES)}
    if touched or len(people) < len(names) or len(projects) < len(slugs):
        return ""
    pools = _past_pools(months, people, projects, now=min(now, ends))
    if not pools:
        return ""
    # Every period that has ended, as `meter` would, from where metering stands (or the history begins)
    # to where it stands after the history, if anywhere: no gap is left, no period metered twice.
    reached = metered_until()
    if reached is not None and reached < begins:
        first = metering.whole_seconds(reached)
    later = MeteredPeriod.objects.filter(start__gte=ends).aggregate(first=Min("start"))["first"]
    delay = settings.METERING_DELAY_SECONDS
    stop = metering.ended_periods(first, metering.whole_seconds(now), period, delay).stop
    records = meter_periods(
        starts=range(first, stop if later is None else min(stop, metering.whole_seconds(later)), period)
    )
    older, last = (f"{month:%Y-%m}" for month in months)
    told = [f"{len(pools)} past pools in {older} and {last}, {records} usage records"]
    told.append(_invoice_older(older, months[1]) if _metered(months[0]) else f"{older} not metered yet")
    if _metered(months[1]):
        told.append(f"{last} in {len(close_month(last, now=now).created)} drafts")
    else:
        told.append(f"{last} to close once metered to its end")
    return ", ".join(told)


def _metered(month: date) -> bool:
    """Whether metering has reached the month's end, as closing it requires."""
    return (first_unmetered() or 0) >= metering.whole_seconds(_span(month)[1])


def _invoice_older(text: str, next_month: date) -> str:
    """Close the month before last early the next month, issue its invoices (e-mailed then, as the
    e-mail task records it) a day later; acme has paid since."""
    closed_at = datetime(next_month.year, next_month.month, 2, 9, tzinfo=ZoneInfo(settings.BILLING_TIME_ZONE))
    issued_at = closed_at + timedelta(days=1, hours=1)
    closing = close_month(text, now=closed_at)
    states = []
    for invoice in sorted(closing.created, key=lambda invoice: invoice.tenant.slug):
        slug = invoice.tenant.slug
        if slug not in PROFILES:
            continue
        Invoice.objects.filter(pk=invoice.pk).update(created_at=closed_at)
        issue(invoice_id=invoice.pk, at=issued_at)
        sent = ", ".join(mail.recipients(invoice.tenant))
        InvoiceMail.objects.create(
            invoice=invoice, recipients=sent, sent_at=issued_at + timedelta(seconds=40)
        )
        if slug == "acme":
            mark_paid(invoice_id=invoice.pk, at=issued_at + timedelta(days=12, hours=5))
        states.append(f"{slug} {'paid' if slug == 'acme' else 'issued'}")
    return f"{text} invoiced ({', '.join(states)})"


def _past_pools(months: tuple[date, date], people: dict, projects: dict, *, now: datetime) -> list[Pool]:
    """The history's pools, recorded by pools' own service as its services would have written them."""
    zone = ZoneInfo(settings.BILLING_TIME_ZONE)
    pools = []
    for past in PAST_POOLS:
        month = months[past.month]
        reserved = datetime(month.year, month.month, past.day, past.hour, tzinfo=zone).astimezone(UTC)
        pools.append(
            history.PastPool(
                project=projects[past.project],
                submitted_by=people[past.who],
                approved_by=people[APPROVER],
                purpose=past.purpose,
                justification=past.justification,
                items=past.items,
                reserved_at=reserved,
                released_at=reserved + timedelta(hours=past.hours),
            )
        )
    return history.record_past_pools(pools, now=now)
