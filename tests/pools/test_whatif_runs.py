"""Kept what-if runs, their services: progress written where the page sees it, one run per run however often
its task is delivered, bad input refused keeping nothing, deadlines kept by the sweeper."""

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from pools.models import WhatIfRun, WhatIfState
from pools.placement.fleet_changes import ADD, REMOVE, FleetChangeError
from pools.selectors.history import HistoryError
from pools.services import dispatch, whatif_runs
from pools.services.deadlines import sweep_stuck_pools
from pools.services.whatif import run_whatif
from pools.services.whatif_runs import MAX_CHANGES, execute_whatif_run, start_whatif_run
from pools.tasks import execute_whatif_run as execute_task
from pools.tasks import sweep_stuck_pools as sweep_task
from tests.factories import WhatIfRunFactory
from tests.pools.whatif_month import LIST, LOSING, sends

pytestmark = pytest.mark.usefixtures("seoul_billing")


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
