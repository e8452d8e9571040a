"""The operators' what-if page: a run asked for on the page is kept, run by a real worker and shown with its
report and charts; progress is written as it goes; a task delivered twice runs once; bad input keeps nothing;
the sweeper fails a run past its deadline; only staff who may view capacity see any of it; the list costs the
same queries however many runs it shows; two done runs compare side by side."""

import io
import json
import re
import time
from datetime import UTC, datetime
from xml.etree import ElementTree

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import translation

from pools.models import WhatIfRun, WhatIfState
from pools.placement.fleet_changes import ADD, REGROUP, REMOVE
from pools.whatif.charts import MEASURES
from pools.whatif.forms import last_month
from pools.whatif.report import run_whatif
from tests.factories import WhatIfRunFactory
from tests.pools.whatif_month import CHANGES, LIST
from tests.portal.test_csp import assert_hardened
from tests.portal.test_korean_pages import visible_text

pytestmark = pytest.mark.usefixtures("seoul_billing")


def svg_of(response) -> ElementTree.Element:
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"] == "image/svg+xml"
    root = ElementTree.fromstring(response.content)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert not [e for e in root.iter() if str(e.tag).endswith("script")]  # an image runs nothing
    return root


def texts(root: ElementTree.Element) -> str:
    return " ".join(e.text or "" for e in root.iter())


# --- end to end through the page and a real worker ----------------------------------------------------------


@pytest.mark.celery
@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_an_operator_asks_on_the_page_and_the_worker_keeps_the_report(march, operator, client, celery_worker):
    client.force_login(operator)
    asked = client.post(LIST, {"month": "2026-03", "cluster": "sim", **CHANGES})
    run = WhatIfRun.objects.get()
    assert asked.status_code == 302 and asked["Location"] == reverse("whatif-run", args=[run.pk])
    assert (run.month, run.cluster, run.requested_by) == ("2026-03", "sim", operator)
    assert run.changes == [[ADD, CHANGES["add"]], [REMOVE, CHANGES["remove"]], [REGROUP, CHANGES["regroup"]]]
    deadline = time.monotonic() + 60
    while (state := WhatIfRun.objects.get().state) != WhatIfState.DONE:
        assert state in (WhatIfState.QUEUED, WhatIfState.RUNNING), WhatIfRun.objects.get().error
        assert time.monotonic() < deadline, f"the run is still {state}; see {celery_worker.log}"
        time.sleep(0.2)
    run.refresh_from_db()
    # What the worker kept is what the one way to such a run answers here.
    expected = run_whatif(month="2026-03", cluster="sim", changes=[tuple(c) for c in run.changes])
    assert run.report == expected and run.progress == 1.0 and run.started_at <= run.finished_at
    real, changed = run.report["fleets"]["real"], run.report["fleets"]["changed"]
    assert (real["requests"], real["gpus"], changed["gpus"]) == (9, 24, 24)
    assert real["mean_wait_seconds"] > changed["mean_wait_seconds"] == 0  # 8 more H100s: nobody waits

    page = client.get(reverse("whatif-run", args=[run.pk])).content.decode()
    assert "data-refresh" not in page  # done: the page stops following it
    assert "Side by side" in page and "real fleet" in page and "changed fleet" in page
    assert "added 8 × H100-80GB (MIG off) in group training" in page
    for metric in MEASURES:
        url = reverse("whatif-chart", kwargs={"pk": run.pk, "metric": metric})
        assert f'src="{url}"' in page
        chart = texts(svg_of(client.get(url)))
        assert "real fleet" in chart and "changed fleet" in chart


def test_the_commands_report_only_gains_each_fleets_series(march):
    out = io.StringIO()
    call_command(
        "simulate",
        "--history",
        "2026-03",
        "--cluster",
        "sim",
        "--add",
        "4 H100-80GB",
        stdout=out,
        stderr=io.StringIO(),
    )
    report = json.loads(out.getvalue())
    assert set(report) == {
        "month",
        "time_zone",
        "cluster",
        "horizon_seconds",
        "estimated_holds",
        "changes",
        "fleets",
    }
    summary = {
        "gpus",
        "requests",
        "admitted",
        "served_slice_hours",
        "mean_wait_seconds",
        "p95_wait_seconds",
        "stranded",
    }
    for fleet in report["fleets"].values():
        assert set(fleet) == summary | {"series"}
        series = fleet["series"]
        assert series["step_seconds"] == 7200 and len(series["at"]) == 31 * 12
        assert {len(series[key]) for key in ("utilisation", "stranded", "waiting", "mean_wait_seconds")} == {
            31 * 12
        }
    # On the 2nd, from 00:00 to 02:00 in Seoul, the first request holds 4 of the 24 GPUs' 168 compute slices.
    assert report["fleets"]["real"]["series"]["utilisation"][12] == round(4 * 7 / 168, 4)


# --- who sees the pages -------------------------------------------------------------------------------------


def urls(run: WhatIfRun, other: WhatIfRun) -> list[str]:
    compare = f"?a={run.pk}&b={other.pk}"
    return [
        LIST,
        reverse("whatif-run", args=[run.pk]),
        reverse("whatif-chart", kwargs={"pk": run.pk, "metric": "utilisation"}),
        reverse("whatif-compare") + compare,
        reverse("whatif-compare-chart", kwargs={"metric": "stranded"}) + compare,
    ]


@pytest.mark.parametrize(
    "who", ["acme_admin", "acme_member", "acme_viewer", "globex_member", "outsider", "finance"]
)
def test_tenants_and_staff_who_may_not_see_capacity_get_404_everywhere(who, tenancy, staff_user, client_for):
    run, other = WhatIfRunFactory(state=WhatIfState.DONE), WhatIfRunFactory(state=WhatIfState.DONE)
    client = client_for(staff_user("finance") if who == "finance" else getattr(tenancy, who))
    for url in urls(run, other):
        assert client.get(url).status_code == 404, url
        assert client.post(url, {"month": "2026-03"}).status_code in (404, 405), url
    assert WhatIfRun.objects.count() == 2


@pytest.mark.parametrize("group", ["operator", "approver"])
def test_staff_who_see_capacity_see_every_page(group, staff_user, client_for):
    run, other = WhatIfRunFactory(state=WhatIfState.DONE), WhatIfRunFactory(state=WhatIfState.DONE)
    client = client_for(staff_user(group))
    for url in urls(run, other):
        assert client.get(url).status_code == 200, url


def test_approvers_see_no_form_and_their_ask_is_refused(march, approver, client_for, settings):
    client = client_for(approver)
    listed = client.get(LIST)
    body = listed.content.decode()
    assert listed.status_code == 200 and listed.context["form"] is None
    assert 'id="whatif-form"' not in body and 'name="add"' not in body
    assert "Operators ask for runs; you may read and compare them." in body
    asked = client.post(LIST, {"month": "2026-03", "cluster": "sim", **CHANGES})
    assert asked.status_code == 403
    assert "Only operators start what-if runs; approvers may read them." in asked.content.decode()
    assert client.post(LIST, {"month": "nope"}).status_code == 403  # refused before the input is read
    assert not WhatIfRun.objects.exists()


def test_operators_see_the_form_with_its_limits_and_refusals_on_it(march, operator, client_for, settings):
    settings.WHATIF_MAX_GPUS, settings.WHATIF_MAX_RUNNING = 30, 2
    client = client_for(operator)
    body = client.get(LIST).content.decode()
    assert 'id="whatif-form"' in body
    assert "The changed fleet may hold at most 30 GPUs." in body and "runs at most 2 at once" in body
    too_large = client.post(LIST, {"month": "2026-03", "cluster": "sim", "add": "7 H100-80GB"})
    assert too_large.status_code == 400
    assert too_large.context["form"].errors["add"] == [
        "With these changes the fleet would hold more than 30 GPUs, the most a what-if run may simulate. "
        "Add fewer GPUs."
    ]
    assert client.post(LIST, {"month": "2026-03", "cluster": "sim", "add": "6 H100-80GB"}).status_code == 302
    again = client.post(LIST, {"month": "2026-02", "cluster": "sim"})
    run = WhatIfRun.objects.get()
    assert again.status_code == 409
    assert again.context["form"].non_field_errors() == [
        f"Your what-if run #{run.pk} is still queued or running; ask for another once it has ended."
    ]
    assert 'value="2026-02"' in again.content.decode()  # the form as it was typed


def test_the_dashboard_links_to_the_what_if_page(fleet, operator, client_for):
    assert f'href="{LIST}"' in client_for(operator).get("/capacity/").content.decode()


# --- the list, a run's page, compare -----------------------------------------------------------------------


def test_the_list_shows_each_run_newest_first_and_the_form_for_last_month(operator, client_for):
    erin = operator
    WhatIfRunFactory(month="2026-09", state=WhatIfState.DONE, requested_by=erin)
    WhatIfRunFactory(month="2026-10", cluster="sim", changes=[], state=WhatIfState.RUNNING, progress=0.5)
    WhatIfRunFactory(month="2026-08", state=WhatIfState.FAILED)
    response = client_for(operator).get(LIST)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.index("2026-08") < body.index("2026-10") < body.index("2026-09")  # newest first
    assert "add: 8 H200-141GB training" in body and "every cluster" in body and "50 %" in body
    assert "staff-operator" in body
    assert response.context["form"]["month"].value() == last_month()
    assert body.count('type="radio" name="a"') == 1  # only a done run can be compared
    assert 'name="cluster"' in body and "every cluster</option>" in body


@pytest.mark.parametrize(
    ("now", "month"),
    [
        (datetime(2026, 11, 30, 16, tzinfo=UTC), "2026-11"),  # already 1 December in Seoul
        (datetime(2026, 11, 30, 14, tzinfo=UTC), "2026-10"),
        (datetime(2027, 1, 5, tzinfo=UTC), "2026-12"),
    ],
)
def test_last_month_is_the_billing_time_zones(now, month):
    assert last_month(now) == month


@pytest.mark.parametrize("count", [2, 15])
def test_the_lists_queries_do_not_grow_with_its_runs(
    count, operator, client_for, django_assert_max_num_queries
):
    client = client_for(operator)
    WhatIfRunFactory(state=WhatIfState.DONE)
    client.get(LIST)
    with CaptureQueriesContext(connection) as few:
        client.get(LIST)
    for n in range(count):
        WhatIfRunFactory(state=(WhatIfState.DONE, WhatIfState.QUEUED)[n % 2], requested_by=operator)
    with django_assert_max_num_queries(len(few)):
        body = client.get(LIST).content.decode()
    assert body.count('href="/capacity/whatif/') >= count + 1


def test_the_list_is_paged(operator, client_for):
    runs = [WhatIfRunFactory() for _ in range(23)]
    client = client_for(operator)
    first = client.get(LIST).content.decode()
    assert (
        f'href="/capacity/whatif/{runs[-1].pk}/"' in first
        and f'href="/capacity/whatif/{runs[0].pk}/"' not in first
    )
    assert "Page 1 of 2" in first
    second = client.get(LIST + "?page=2").content.decode()
    assert f'href="/capacity/whatif/{runs[0].pk}/"' in second


def test_a_queued_or_running_run_shows_its_progress_and_refreshes_itself(operator, client_for):
    client = client_for(operator)
    running = WhatIfRunFactory(state=WhatIfState.RUNNING, progress=0.5)
    body = client.get(reverse("whatif-run", args=[running.pk])).content.decode()
    assert 'id="whatif-live" data-refresh="10"' in body
    assert '<progress value="0.5" max="1">' in body and "50 %" in body
    assert "add: 8 H200-141GB training" in body
    failed = WhatIfRunFactory(state=WhatIfState.FAILED)
    body = client.get(reverse("whatif-run", args=[failed.pk])).content.decode()
    assert "data-refresh" not in body and "<progress" not in body
    assert "The run failed: --remove h200-9: the fleet has no node &#x27;h200-9&#x27;." in body
    chart = client.get(reverse("whatif-chart", kwargs={"pk": failed.pk, "metric": "waiting"}))
    assert (
        chart.status_code == 400
        and chart.content.decode() == f"What-if run #{failed.pk} is not done: it has no figures yet."
    )
    assert client.get(reverse("whatif-chart", kwargs={"pk": failed.pk, "metric": "power"})).status_code == 404
    assert client.get(reverse("whatif-run", args=[failed.pk + 100])).status_code == 404


def test_a_done_run_shows_its_fleets_side_by_side(operator, client_for):
    run = WhatIfRunFactory(state=WhatIfState.DONE)
    response = client_for(operator).get(reverse("whatif-run", args=[run.pk]))
    rows = {row.label: row.cells for row in response.context["rows"]}
    assert rows["GPUs"] == ["16", "24"] and rows["Admitted"] == ["9", "10"]
    assert rows["Mean wait"] == ["1.5 h", "0 s"] and rows["95th percentile wait"] == ["2.0 h", "0 s"]
    assert rows["Stranded compute slices (min / mean / max)"] == ["0 / 1.5 / 3", "0 / 1.5 / 3"]
    body = response.content.decode()
    assert "Each point is the mean over 2 hours." in body
    assert "1 request was never admitted" in body


def test_a_chart_draws_each_fleet_along_the_month(operator, client_for):
    run = WhatIfRunFactory(state=WhatIfState.DONE)
    client = client_for(operator)
    root = svg_of(client.get(reverse("whatif-chart", kwargs={"pk": run.pk, "metric": "utilisation"})))
    words = texts(root)
    assert "Utilisation (%)" in words and "Day of the month (Asia/Seoul)" in words
    assert "real fleet" in words and "changed fleet" in words
    response = client.get(reverse("whatif-chart", kwargs={"pk": run.pk, "metric": "wait"}))
    assert response["Cache-Control"] == "private, max-age=300"
    assert "default-src 'none'" in response["Content-Security-Policy"]
    korean = texts(
        svg_of(
            client.get(
                reverse("whatif-chart", kwargs={"pk": run.pk, "metric": "waiting"}), HTTP_ACCEPT_LANGUAGE="ko"
            )
        )
    )
    assert "실제 장비" in korean


def test_compare_sets_two_done_runs_side_by_side_and_overlays_their_charts(operator, client_for):
    first = WhatIfRunFactory(month="2026-10", state=WhatIfState.DONE)
    second = WhatIfRunFactory(month="2026-11", state=WhatIfState.DONE)
    client = client_for(operator)
    response = client.get(reverse("whatif-compare") + f"?a={first.pk}&b={second.pk}")
    assert response.status_code == 200
    headings = [column.heading for column in response.context["columns"]]
    assert headings == [
        f"#{run.pk} {fleet} fleet" for run in (first, second) for fleet in ("real", "changed")
    ]
    body = response.content.decode()
    assert "2026-10" in body and "2026-11" in body
    chart = (
        reverse("whatif-compare-chart", kwargs={"metric": "utilisation"}) + f"?a={first.pk}&amp;b={second.pk}"
    )
    assert f'src="{chart}"' in body
    words = texts(svg_of(client.get(chart.replace("&amp;", "&"))))
    assert all(heading in words for heading in headings)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "Choose two done runs to compare, as ?a=ID&amp;b=ID."),
        ("?a={done}", "Choose two done runs to compare"),
        ("?a={done}&b=x1", "A run is named by its number, not &#x27;x1&#x27;."),
        ("?a=-1&b=1e3", "A run is named by its number, not &#x27;-1&#x27;, &#x27;1e3&#x27;."),
        ("?a={done}&b={done}", "Choose two different runs to compare."),
        ("?a={done}&b={queued}", "Only done runs can be compared; not #{queued}."),
        ("?a=999999&b={done}", "Only done runs can be compared; not #999999."),
    ],
)
def test_compare_refuses_what_it_cannot_compare(query, message, operator, client_for):
    ids = {"done": WhatIfRunFactory(state=WhatIfState.DONE).pk, "queued": WhatIfRunFactory().pk}
    client = client_for(operator)
    response = client.get(reverse("whatif-compare") + query.format(**ids))
    assert response.status_code == 400 and message.format(**ids) in response.content.decode()
    chart = client.get(reverse("whatif-compare-chart", kwargs={"metric": "wait"}) + query.format(**ids))
    assert chart.status_code == 400 and chart["Content-Type"].startswith("text/plain")


def test_the_pages_speak_korean_and_show_no_english_state(operator, client_for):
    runs = {state: WhatIfRunFactory(state=state) for state in WhatIfState}
    client = client_for(operator)
    korean = {"HTTP_ACCEPT_LANGUAGE": "ko"}
    listed = client.get(LIST, **korean).content.decode()
    assert "새 실행" in listed and "GPU 추가" in listed and "모든 클러스터" in listed
    with translation.override("en"):
        english = [str(label) for label in WhatIfState.labels]
    shown = visible_text(listed)
    assert [word for word in english if re.search(rf"(?<![\w-]){word}(?![\w-])", shown)] == []
    done = client.get(reverse("whatif-run", args=[runs[WhatIfState.DONE].pk]), **korean).content.decode()
    assert "나란히 보기" in done and "실제 장비" in done and "평균 대기" in done and "1.5시간" in done
    compare = (
        reverse("whatif-compare") + f"?a={runs[WhatIfState.DONE].pk}&b={WhatIfRunFactory(state='done').pk}"
    )
    assert "가정 실행" in client.get(compare, **korean).content.decode()


def test_the_pages_hold_nothing_the_policy_refuses(operator, client_for):
    done, other = WhatIfRunFactory(state=WhatIfState.DONE), WhatIfRunFactory(state=WhatIfState.DONE)
    running = WhatIfRunFactory(state=WhatIfState.RUNNING, progress=0.25)
    client = client_for(operator)
    for url in (
        LIST,
        reverse("whatif-run", args=[done.pk]),
        reverse("whatif-run", args=[running.pk]),
        reverse("whatif-compare") + f"?a={done.pk}&b={other.pk}",
    ):
        assert_hardened(client.get(url))
    assert_hardened(client.post(LIST, {"month": "nope"}), status=400)


def test_runs_of_every_state_from_the_factory_are_valid_rows(db):
    for state in WhatIfState:
        WhatIfRunFactory(state=state).full_clean()
