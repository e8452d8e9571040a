"""Kept what-if runs, their services: progress written where the page sees it, one run per run however often
its task is delivered, bad input refused keeping nothing, deadlines kept by the sweeper."""

import threading
from datetime import timedelta

import pytest
from celery import Celery
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from pools import conf, task_names
from pools.models import WhatIfRun, WhatIfState
from pools.placement.fleet_changes import ADD, REGROUP, REMOVE, FleetChangeError
from pools.selectors.history import HistoryError
from pools.services.deadlines import sweep_stuck_pools
from pools.tasks import execute_whatif_run as execute_task
from pools.tasks import sweep_stuck_pools as sweep_task
from pools.whatif import runs as whatif_runs
from pools.whatif.report import TOO_LARGE, run_whatif
from pools.whatif.runs import MAX_CHANGES, execute_whatif_run, start_whatif_run
from portal.celery import route_to_own_queue
from portal.errors import Conflict, InvalidInput, NotAllowed
from tests.conftest import TASK_QUEUE
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
    assert sends(callbacks) == [(task_names.WHATIF_RUN, (run.pk,))]
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
    # 50 lines of 10,000 GPUs: half a million GPUs, refused in the request, before any fleet is built.
    ({"add": "10000 H100-80GB\n" * MAX_CHANGES}, "add", "the fleet would hold more than 32000 GPUs"),
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


# --- limits: the size of a run's fleet, runs going at once, who may start one ------------------------------


def test_a_changed_fleet_past_the_cap_is_refused_before_anything_is_kept(
    march, operator, settings, django_capture_on_commit_callbacks
):
    settings.WHATIF_MAX_GPUS = 40  # today's fleet: 24 GPUs
    with django_capture_on_commit_callbacks() as callbacks:
        with pytest.raises(
            InvalidInput, match="would hold more than 40 GPUs, the most a what-if run may"
        ) as e:
            start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=[(ADD, "17 H100-80GB")])
        # Every step counts: the removal after the additions comes too late.
        with pytest.raises(InvalidInput, match="more than 40 GPUs"):
            start_whatif_run(
                user=operator,
                month="2026-03",
                cluster="sim",
                changes=[(ADD, "9 H100-80GB"), (ADD, "8 H200-141GB"), (REMOVE, "h100-1")],
            )
    assert e.value.field == "add"
    assert not WhatIfRun.objects.exists() and sends(callbacks) == []
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=[(ADD, "16 H100-80GB")])
    assert run.state == WhatIfState.QUEUED  # exactly the cap


def test_the_request_counts_gpus_per_node_and_the_worker_builds_the_changed_fleet(march, operator):
    changes = [(ADD, "16 H100-80GB"), (REMOVE, "h200-2"), (REGROUP, "sim/added-1=inference")]
    with CaptureQueriesContext(connection) as asked:
        run = start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=changes)
    reads = [query["sql"] for query in asked.captured_queries]
    assert not [sql for sql in reads if '"pools_allocation"' in sql]  # no picture of the fleet is taken
    (gpus,) = [sql for sql in reads if '"pools_gpucapacity"' in sql]
    assert "COUNT(" in gpus and "GROUP BY" in gpus  # one row per node, none per GPU
    run.refresh_from_db()
    assert run.changes == [list(change) for change in changes] and run.report is None

    assert execute_whatif_run(run_id=run.pk) == WhatIfState.DONE
    run.refresh_from_db()
    assert run.report["fleets"]["changed"]["gpus"] == 24 + 16 - 8
    assert run.report["changes"] == [
        "added 16 × H100-80GB (MIG off) in no group: sim/added-1, sim/added-2",
        "removed sim/h200-2: 8 × H200-141GB",
        "regrouped sim/added-1 (8 GPUs): no group → inference",
    ]


def test_the_worker_checks_the_cap_again_and_builds_no_fleet_past_it(march, operator, settings):
    settings.WHATIF_MAX_GPUS = 40
    run = start_whatif_run(user=operator, month="2026-03", cluster="sim", changes=[(ADD, "16 H100-80GB")])
    settings.WHATIF_MAX_GPUS = 39  # lowered since (or today's fleet grew)
    assert execute_whatif_run(run_id=run.pk) == WhatIfState.FAILED
    run.refresh_from_db()
    message = (
        "With these changes the fleet would hold more than 39 GPUs, the most a what-if run may simulate."
    )
    assert run.error.startswith(message) and run.report is None
    assert run.error_data == {"template": TOO_LARGE, "params": {"most": 39}}  # shown in the reader's language
    # A run kept before there was a cap: half a million GPUs, refused before a GPU of them is made.
    settings.WHATIF_MAX_GPUS = 32_000
    old = WhatIfRunFactory(month="2026-03", cluster="sim", changes=[[ADD, "10000 H100-80GB"]] * MAX_CHANGES)
    assert execute_whatif_run(run_id=old.pk) == WhatIfState.FAILED
    old.refresh_from_db()
    assert "would hold more than 32000 GPUs" in old.error


def test_one_run_going_per_person(march, operator, more_operators, django_capture_on_commit_callbacks):
    (erin,) = more_operators(1)
    first = start_whatif_run(user=operator, month="2026-03", cluster="sim")
    with (
        django_capture_on_commit_callbacks() as callbacks,
        pytest.raises(Conflict, match=f"Your what-if run #{first.pk} is still queued or running; ask"),
    ):
        start_whatif_run(user=operator, month="2026-02", cluster="sim")
    assert sends(callbacks) == [] and WhatIfRun.objects.count() == 1
    start_whatif_run(user=erin, month="2026-03", cluster="sim")  # someone else's run is theirs
    assert execute_whatif_run(run_id=first.pk) == WhatIfState.DONE
    again = start_whatif_run(user=operator, month="2026-02", cluster="sim")  # once it has ended
    assert again.state == WhatIfState.QUEUED and WhatIfRun.objects.count() == 3


def test_at_most_so_many_runs_going_at_once(march, operator, more_operators, settings):
    settings.WHATIF_MAX_RUNNING = 2
    erin, frank = more_operators(2)
    WhatIfRunFactory(requested_by=erin, state=WhatIfState.QUEUED)
    running = WhatIfRunFactory(requested_by=frank, state=WhatIfState.RUNNING)
    WhatIfRunFactory(state=WhatIfState.DONE)
    WhatIfRunFactory(state=WhatIfState.FAILED)
    with pytest.raises(Conflict, match="The portal runs at most 2 what-if runs at once, and as many are"):
        start_whatif_run(user=operator, month="2026-03", cluster="sim")
    assert WhatIfRun.objects.count() == 4
    WhatIfRun.objects.filter(pk=running.pk).update(state=WhatIfState.FAILED)
    assert start_whatif_run(user=operator, month="2026-03", cluster="sim").state == WhatIfState.QUEUED


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
@pytest.mark.parametrize("who", ["one person twice", "two people, one run at a time"])
def test_asks_at_the_same_moment_count_each_other(
    who, march, operator, more_operators, monkeypatch, settings
):
    monkeypatch.setattr(whatif_runs, "dispatch", LOSING)
    people = [operator, operator] if who == "one person twice" else [operator, *more_operators(1)]
    settings.WHATIF_MAX_RUNNING = 2 if who == "one person twice" else 1
    together = threading.Barrier(2)
    kept, refused = [], []

    def ask(person):
        together.wait()
        try:
            kept.append(start_whatif_run(user=person, month="2026-03", cluster="sim"))
        except Conflict as error:
            refused.append(error)
        finally:
            connections.close_all()

    askers = [threading.Thread(target=ask, args=[person]) for person in people]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert (len(kept), len(refused)) == (1, 1)
    assert WhatIfRun.objects.count() == 1


def test_approvers_read_runs_but_may_not_start_one(march, approver):
    with pytest.raises(NotAllowed, match=r"Only operators start what-if runs; approvers may read them\."):
        start_whatif_run(user=approver, month="2026-03", cluster="sim")
    assert not WhatIfRun.objects.exists()


def test_what_if_runs_go_to_a_queue_of_their_own(settings):
    """The app's plugin routes the task to WHATIF_QUEUE, through the real broker, provisioning and syncs to
    queues of their own and the rest to the default queue; the tests send every task, what-if runs too, to
    this session's queue."""
    assert conf.settings.WHATIF_QUEUE == "whatif"
    assert route_to_own_queue(task_names.WHATIF_RUN, (), {}, {}) == {"queue": "whatif"}
    for other in (task_names.PROVISION, task_names.ADMIT):
        assert route_to_own_queue(other, (), {}, {}) == {"queue": conf.settings.PROVISIONING_QUEUE}
    assert route_to_own_queue(task_names.SYNC, (), {}, {}) == {"queue": conf.settings.SYNC_QUEUE}
    for other in (task_names.EVENT_EMAIL, "pools.tasks.x"):
        assert route_to_own_queue(other, (), {}, {}) is None

    # Through Redis: the route puts the task on its queue's list, and on no other. The queue is one of this
    # test's own, so that no worker of the machine takes the task.
    settings.WHATIF_QUEUE = queue = f"{TASK_QUEUE}-whatif"
    settings.CELERY_TASK_DEFAULT_QUEUE = default = f"{TASK_QUEUE}-default"
    sender = Celery("sender", set_as_current=False)  # the portal's app stays the current one
    sender.config_from_object("django.conf:settings", namespace="CELERY")
    sender.conf.task_routes = (route_to_own_queue,)
    with sender.connection_for_write() as broker:
        redis = broker.default_channel.client
        try:
            sender.send_task(task_names.WHATIF_RUN, args=[1], connection=broker)
            assert (redis.llen(queue), redis.llen(default)) == (1, 0)
        finally:
            redis.delete(queue, default)

    from portal.celery import app

    assert app.amqp.router.route({}, task_names.WHATIF_RUN)["queue"].name == TASK_QUEUE
