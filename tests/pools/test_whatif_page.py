"""The operators' what-if page: a run asked for on the page is kept, run by a real worker and shown with its
report and charts; progress is written as it goes; a task delivered twice runs once; bad input keeps nothing;
the sweeper fails a run past its deadline; only staff who may view capacity see any of it; the list costs the
same queries however many runs it shows; two done runs compare side by side."""

import io
import json
import re
import threading
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from xml.etree import ElementTree
from zoneinfo import ZoneInfo

import pytest
from django.core.management import call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone, translation

from pools.models import PoolRequest, PoolState, RequestState, WhatIfRun, WhatIfState
from pools.placement.fleet_changes import ADD, REGROUP, REMOVE, FleetChangeError
from pools.selectors.history import HistoryError
from pools.services import dispatch, whatif_runs
from pools.services.deadlines import sweep_stuck_pools
from pools.services.whatif import run_whatif
from pools.services.whatif_runs import MAX_CHANGES, execute_whatif_run, start_whatif_run
from pools.tasks import execute_whatif_run as execute_task
from pools.tasks import sweep_stuck_pools as sweep_task
from pools.whatif_charts import MEASURES
from pools.whatif_views import last_month
from tests.factories import PoolFactory, PoolRequestFactory, WhatIfRunFactory
from tests.portal.test_csp import assert_hardened
from tests.portal.test_korean_pages import visible_text

SEOUL = ZoneInfo("Asia/Seoul")
LIST = "/capacity/whatif/"
CHANGES = {"add": "8 H100-80GB training", "remove": "h200-2", "regroup": "h100-1=inference"}


def kst(day: int, hour: int = 0) -> datetime:
    return datetime(2026, 3, day, hour, tzinfo=SEOUL)


@pytest.fixture(autouse=True)
def _billing_zone(settings):
    settings.BILLING_TIME_ZONE = "Asia/Seoul"


@pytest.fixture
def march(fleet, tenancy):
    """2026-03 on the small fleet, written as given state (no task is sent): requests for 4 whole H100s
    approved every two hours on the 2nd, each pool held 5 hours, so that the later ones wait for the
    earlier; every third cancelled while it waited."""
    for n in range(9):
        request = PoolRequestFactory(
            project=tenancy.vision, cluster=fleet, purpose="", state=RequestState.FULFILLED,
            approved_at=kst(2, 2 * n), items=[("h100-80gb.full", 4)],
        )  # fmt: skip
        if n % 3 == 2:
            PoolRequest.objects.filter(pk=request.pk).update(state=RequestState.CANCELLED)
        else:
            PoolFactory(
                project=tenancy.vision, request=request, cluster=fleet, state=PoolState.RELEASED,
                reserved_at=kst(2, 2 * n), released_at=kst(2, 2 * n + 5),
            )  # fmt: skip
    return fleet


# The runs' way to Celery, losing what it sends: a test that commits runs its run itself, not the worker.
LOSING = SimpleNamespace(WHATIF_RUN=dispatch.WHATIF_RUN, after_commit=lambda task, *args: None)


def sends(callbacks) -> list[tuple[str, tuple]]:
    return [(c.task, c.args) for c in callbacks if isinstance(c, dispatch.Send)]


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


# --- services: progress, one run per run, bad input, deadlines ---------------------------------------------


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_progress_is_written_where_the_page_sees_it_while_the_run_goes(march, operator, monkeypatch):
    monkeypatch.setattr(whatif_runs, "dispatch", LOSING)
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=[(REMOVE, "h200-1")])
    seen = []

    def read_elsewhere():  # another connection, as the page's request has: only committed writes show
        seen.append(WhatIfRun.objects.values_list("state", "progress").get(pk=run.pk))
        connections.close_all()

    def observed(**kwargs):
        told = kwargs.pop("progress")

        def progress(done):
            told(done)
            reader = threading.Thread(target=read_elsewhere)
            reader.start()
            reader.join()

        return run_whatif(**kwargs, progress=progress)

    monkeypatch.setattr(whatif_runs, "run_whatif", observed)
    assert execute_whatif_run(run_id=run.pk) == WhatIfState.DONE
    assert {state for state, _done in seen} == {WhatIfState.RUNNING}
    shares = [done for _state, done in seen]
    assert shares == sorted(shares) and 0 < shares[0] < 0.5 and 0.5 in shares and shares[-1] == 1.0
    assert WhatIfRun.objects.values_list("state", "progress").get() == (WhatIfState.DONE, 1.0)


def test_a_run_is_kept_queued_and_sent_once_committed(march, operator, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        run = start_whatif_run(
            user=operator, month=" 2026-03 ", cluster="sim", changes=[(ADD, " 8 H100-80GB ")]
        )
    assert sends(callbacks) == [(dispatch.WHATIF_RUN, (run.pk,))]
    run.refresh_from_db()
    assert (run.state, run.month, run.changes, run.report) == (
        WhatIfState.QUEUED,
        "2026-03",
        [[ADD, "8 H100-80GB"]],
        None,
    )
    assert timedelta(minutes=29) < run.deadline - timezone.now() <= timedelta(minutes=30)


def test_a_second_delivery_of_the_task_does_nothing(march, operator, monkeypatch):
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim")
    calls = []
    monkeypatch.setattr(whatif_runs, "run_whatif", lambda **kw: calls.append(kw) or run_whatif(**kw))
    assert execute_task.apply(args=[run.pk]).get() == WhatIfState.DONE
    first = WhatIfRun.objects.get()
    assert execute_task.apply(args=[run.pk]).get() == WhatIfState.DONE
    again = WhatIfRun.objects.get()
    assert len(calls) == 1
    assert (again.report, again.finished_at, again.started_at) == (
        first.report,
        first.finished_at,
        first.started_at,
    )
    assert list(first.report["fleets"]) == ["real"]
    assert execute_task.apply(args=[run.pk + 1000]).get() == "gone"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
def test_two_deliveries_at_once_run_it_once(march, operator, monkeypatch):
    monkeypatch.setattr(whatif_runs, "dispatch", LOSING)
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim")
    calls, answers = [], []
    together = threading.Barrier(2)
    monkeypatch.setattr(whatif_runs, "run_whatif", lambda **kw: calls.append(kw) or run_whatif(**kw))

    def deliver():
        together.wait()
        try:
            answers.append(execute_whatif_run(run_id=run.pk))
        finally:
            connections.close_all()

    workers = [threading.Thread(target=deliver) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 1  # the row lock lets one claim it; the other finds it running or done
    assert WhatIfState.DONE in answers and set(answers) <= {WhatIfState.DONE, WhatIfState.RUNNING}
    assert WhatIfRun.objects.get().state == WhatIfState.DONE


def test_a_run_that_fails_says_why_and_never_stays_running(march, operator, monkeypatch):
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=[(REMOVE, "h200-2")])
    march.nodes.filter(name="h200-2").delete()  # gone from the fleet since it was asked for
    assert execute_whatif_run(run_id=run.pk) == WhatIfState.FAILED
    run.refresh_from_db()
    assert run.state == WhatIfState.FAILED and run.report is None and run.finished_at
    assert run.error.startswith("--remove h200-2: the fleet has no node 'h200-2'")

    other = start_whatif_run(user=operator, month="2026-03", cluster="sim")

    def broken(**kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(whatif_runs, "run_whatif", broken)
    assert execute_whatif_run(run_id=other.pk) == WhatIfState.FAILED
    other.refresh_from_db()
    assert (
        other.error
        == "The run stopped on an unexpected error (ZeroDivisionError); the worker's log tells more."
    )


BAD_FORMS = [
    ({"month": "2026-13"}, "month", "A month is written YYYY-MM, from 2000-01 to 2999-12, e.g. 2026-11, not"),
    ({"month": "2999-12"}, "month", "The month 2999-12 has not begun yet (Asia/Seoul)."),
    ({"month": ""}, "month", "This field is required."),
    ({"cluster": "nope"}, "cluster", "Select a valid choice. nope is not one of the available choices."),
    ({"add": "8 X100"}, "add", "--add &#x27;8 X100&#x27;: unknown GPU model &#x27;X100&#x27;"),
    ({"add": "0 H100-80GB"}, "add", "the count must be a whole number above 0"),
    ({"add": "8 H100-80GB", "cluster": ""}, "add", "the fleet spans the clusters other, sim; name the"),
    ({"remove": "h200-1\nh200-9"}, "remove", "--remove h200-9: the fleet has no node &#x27;h200-9&#x27;"),
    ({"regroup": "h100-1"}, "regroup", "--regroup takes &quot;NODE=GROUP&quot;"),
    ({"regroup": "h100-1=Bad_Group"}, "regroup", "is not a GPU group name"),
    ({"add": "1 H100-80GB\n" * (MAX_CHANGES + 1)}, None, f"At most {MAX_CHANGES} fleet changes make one run"),
]


@pytest.mark.parametrize(("data", "field", "message"), BAD_FORMS)
def test_bad_input_shows_the_form_again_and_keeps_nothing(
    data, field, message, march, synced, operator, client_for, django_capture_on_commit_callbacks
):
    synced([("a100", 1, "A100-80GB", [None] * 8)], name="other")
    posted = {"month": "2026-03", "cluster": "sim", **data}
    with django_capture_on_commit_callbacks() as callbacks:
        response = client_for(operator).post(LIST, posted)
    assert response.status_code == 400
    body = response.content.decode()
    assert message in body
    assert 'id="whatif-form"' in body and f'value="{posted["month"]}"' in body  # as it was typed
    if field:  # shown beside the field it is about
        form = response.context["form"]
        assert (
            form.errors[field]
            and message.replace("&#x27;", "'").replace("&quot;", '"') in form.errors[field][0]
        )
    assert not WhatIfRun.objects.exists() and sends(callbacks) == []


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ([("resize", "h100-1")], FleetChangeError),
        ([(ADD, 8)], FleetChangeError),
        ([(REMOVE, "h100-1")] * (MAX_CHANGES + 1), FleetChangeError),
    ],
)
def test_the_service_refuses_before_keeping_anything(changes, error, march, operator):
    with pytest.raises(error):
        start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=changes)
    with pytest.raises(HistoryError, match="No cluster is named 'nope'"):
        start_whatif_run(user=operator, month="2026-03", cluster="nope")
    assert not WhatIfRun.objects.exists()


def test_a_run_past_its_deadline_is_failed_by_the_sweeper(operator, client_for, settings):
    settings.WHATIF_RUN_SECONDS = 1800
    now = timezone.now()
    waiting = WhatIfRunFactory(state=WhatIfState.QUEUED, deadline=now - timedelta(seconds=1))
    stuck = WhatIfRunFactory(state=WhatIfState.RUNNING, deadline=now - timedelta(minutes=5))
    young = WhatIfRunFactory(state=WhatIfState.RUNNING, deadline=now + timedelta(minutes=5))
    done = WhatIfRunFactory(state=WhatIfState.DONE, deadline=now - timedelta(hours=1))
    report = sweep_stuck_pools(now=now)
    assert sorted(report.whatif_failed) == sorted([waiting.pk, stuck.pk])
    assert (
        report.summary()
        == "0 re-driven, 0 failed, 0 released as stuck, 2 what-if runs failed past their deadline"
    )
    states = dict(WhatIfRun.objects.values_list("pk", "state"))
    assert states == {waiting.pk: "failed", stuck.pk: "failed", young.pk: "running", done.pk: "done"}
    waiting.refresh_from_db()
    stuck.refresh_from_db()
    assert waiting.error == "No worker started the run within 30 minutes." and waiting.finished_at == now
    assert stuck.error == "The run did not finish within 30 minutes."
    assert execute_whatif_run(run_id=waiting.pk) == WhatIfState.FAILED  # a late delivery leaves it failed
    assert sweep_task.apply().get() == "0 re-driven, 0 failed, 0 released as stuck"  # nothing more to fail
    # The reason is the portal's own, so each reader has it in their language.
    page = client_for(operator).get(reverse("whatif-run", args=[stuck.pk]), HTTP_ACCEPT_LANGUAGE="ko")
    assert "30분 안에 끝나지 않았습니다" in page.content.decode()


def test_a_worker_finishing_after_the_sweeper_failed_the_run_keeps_nothing(march, operator, monkeypatch):
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim")

    def overtaken(**kwargs):
        report = run_whatif(**kwargs)
        sweep_stuck_pools(now=timezone.now() + timedelta(hours=1))  # meanwhile, past the run's deadline
        return report

    monkeypatch.setattr(whatif_runs, "run_whatif", overtaken)
    assert execute_whatif_run(run_id=run.pk) == WhatIfState.FAILED
    run.refresh_from_db()
    assert run.report is None and run.error == "The run did not finish within 30 minutes."


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
