"""The demo's price list: every spec priced, a MIG instance at its share of the GPU, written once."""

from decimal import Decimal

from billing.demo import FULL_GPU_HOURLY, share_price
from billing.models import Price
from pools import mig
from pools.specs import specs_of
from tests.billing.demo import load_demo


def test_the_demo_prices_every_spec_once_by_its_share_of_the_gpu(db):
    load_demo()
    load_demo()
    specs = specs_of(list(FULL_GPU_HOURLY))
    prices = {(p.gpu_model, p.profile): p.hourly_price for p in Price.objects.all()}
    assert len(prices) == Price.objects.count() == len(specs)
    assert prices[("H100-80GB", "full")] == Decimal("4200")
    assert prices[("H100-80GB", "3g.40gb")] == Decimal("1800")  # 3 of 7 compute slices
    for spec in specs:
        assert Decimal(0) < prices[(spec.gpu_model, spec.profile)] <= prices[(spec.gpu_model, mig.FULL_GPU)]
    assert share_price("H200-141GB", "1g.18gb") == Decimal("800")
