"""Demo data of billing: a price list for every spec, a MIG instance priced by its share of the GPU."""

from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from zoneinfo import ZoneInfo

from django.conf import settings

from billing.models import PriceList
from billing.services import add_price
from pools import mig
from pools.specs import specs_of

LIST_NAME = "Standard"
# Hourly price of a whole GPU in the demo's currency (KRW); an instance pays its compute slices' share.
FULL_GPU_HOURLY = {
    "A100-40GB": Decimal("2100"),
    "A100-80GB": Decimal("2800"),
    "H100-80GB": Decimal("4200"),
    "H200-141GB": Decimal("5600"),
    "B200-180GB": Decimal("8400"),
}


def share_price(gpu_model: str, profile: str) -> Decimal:
    full = FULL_GPU_HOURLY[gpu_model]
    if profile == mig.FULL_GPU:
        return full
    compute = mig.gpu_model(gpu_model).profile(profile).compute_slices
    return (full * compute / mig.COMPUTE_SLICES).quantize(Decimal("1"), rounding=ROUND_HALF_UP)


def load(stdout) -> None:
    price_list, created = PriceList.objects.get_or_create(
        name=LIST_NAME, defaults={"description": "Demo prices: a MIG instance costs its share of the GPU."}
    )
    if not created or price_list.prices.exists():
        return
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
    stdout.write(f"price list {LIST_NAME}: {len(specs)} prices in {settings.BILLING_CURRENCY}")
