"""Journey 4: an operator reads the fleet overview, drills into a GPU, drains it after the warning that
names the pool still running there, and acknowledges an alert."""

import pytest

from monitoring.ingest import collection
from monitoring.models import Alert
from pools.models import GpuCapacity
from tests.factories import AlertFactory, AllocationFactory, PoolFactory

from .conftest import JOURNEY, settle

pytestmark = JOURNEY


@pytest.fixture
def running(fleet, tenancy):
    """acme's pool holds h100-1's GPU 0 whole; the collector has read the fleet; the GPU is too hot."""
    gpu = GpuCapacity.objects.get(node__name="h100-1", index=0)
    pool = PoolFactory(project=tenancy.vision, cluster=fleet)
    AllocationFactory(pool=pool, gpu=gpu)
    collection.collect(fleet)
    alert = AlertFactory(gpu=gpu)
    settle()
    return gpu, pool, alert


def test_an_operator_drills_into_a_gpu_drains_it_and_acknowledges_an_alert(
    journey, operator, running, client, settings
):
    gpu, pool, alert = running
    page = journey.page
    journey.sign_in_with_cookie(client, operator, settings)
    journey.go("monitoring-fleet")
    journey.shot("fleet")

    page.locator(f"a[href='/monitoring/gpus/{gpu.pk}/']").first.click()
    page.wait_for_url(f"**/monitoring/gpus/{gpu.pk}/")
    journey.check_language()
    assert f"#{pool.pk}" in page.locator("main").inner_text()  # who holds it
    journey.shot("gpu")

    journey.go("capacity-dashboard")
    journey.shot("capacity")
    page.locator(f"a[href='/capacity/nodes/{gpu.node_id}/']").first.click()
    page.wait_for_url(f"**/capacity/nodes/{gpu.node_id}/")
    page.click(f"button[formaction='/capacity/gpus/{gpu.pk}/drain/'][value=drain]")
    page.wait_for_url(f"**/capacity/gpus/{gpu.pk}/drain/")
    journey.check_language()
    assert page.locator(".message.warning").count() == 1
    [named] = page.locator(".drain-pools li").all_inner_texts()
    assert named.startswith("acme / vision / ") and named.endswith(f" #{pool.pk}")
    assert not GpuCapacity.objects.get(pk=gpu.pk).drained  # the warning changes nothing
    settle()
    journey.shot("drain-warning")
    page.click("main form button[type=submit]")
    page.wait_for_url(f"**/capacity/nodes/{gpu.node_id}/")
    journey.check_language()
    assert f" #{pool.pk}" in page.locator(".messages .message.warning").inner_text()
    assert GpuCapacity.objects.get(pk=gpu.pk).drained
    settle()
    journey.shot("drained")

    page.click("a[href='/monitoring/alerts/']")
    page.wait_for_url("**/monitoring/alerts/")
    journey.check_language()
    page.click(f"a[href='/monitoring/alerts/{alert.pk}/']")
    page.wait_for_url(f"**/monitoring/alerts/{alert.pk}/")
    journey.shot("alert")
    page.click(f"form[action='/monitoring/alerts/{alert.pk}/acknowledge/'] button")
    page.wait_for_url(f"**/monitoring/alerts/{alert.pk}/")
    journey.check_language()
    assert page.locator(f"form[action='/monitoring/alerts/{alert.pk}/acknowledge/']").count() == 0
    journey.shot("acknowledged")
    acknowledged = Alert.objects.get(pk=alert.pk)
    settle()
    assert acknowledged.acknowledged_by == operator and acknowledged.resolved_at is None
