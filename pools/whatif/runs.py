"""Kept what-if runs (pools/models/whatif.py): asked for on the operators' page, run by a worker, failed by
the sweeper when they overstay a deadline.

The life of a run: `start_whatif_run`, an operator's (`pools.add_whatifrun`), checks what it can cheaply
before anything is kept: the fleet changes as written, the month, the cluster, and the changes against a
count of today's GPUs per node (every node they name is there; the changed fleet stays within
WHATIF_MAX_GPUS at every step). No fleet is built in the web request. Then, under one lock so that two asks
at once count each other, it keeps the run `queued` only while its asker has no other run queued or running
and fewer than WHATIF_MAX_RUNNING runs are, and sends its task, once the row is committed, to the what-if
queue (WHATIF_QUEUE), which workers of their own consume. The task's `execute_whatif_run` claims the run
(`running`), runs pools.whatif.report.run_whatif, which builds the changed fleet and checks the cap again
on today's fleet, writing the progress it is told as it goes, and ends the run `done` with its report or
`failed` with why. A run already claimed, or ended, is left alone: a task delivered twice does the
work once. Past its deadline a run in between is failed by the sweeper (pools/services/deadlines.py), and a
worker finishing late finds it failed and keeps nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_noop

from pools import task_names
from pools.apps import START_WHATIF
from pools.conf import settings
from pools.models import WHATIF_IN_BETWEEN, WHATIF_TRANSITIONS, WhatIfRun, WhatIfState
from pools.placement.fleet_changes import FleetChangeError, parse_changes, peak_size
from pools.selectors.history import fleet_nodes, month_span
from pools.whatif.report import BAD_INPUT, TOO_LARGE, FleetTooLarge, InvalidAnswer, run_whatif
from portal import audit, dispatch
from portal.errors import Conflict, InvalidInput
from portal.permissions import require_staff_action, staff_may

log = logging.getLogger(__name__)

# More changes than anyone types into a form; a limit keeps a pasted list from making a run that never ends.
MAX_CHANGES = 50
START_LOCK = 0x7768_6966  # pg advisory lock key ("whif"): one start at a time counts the runs going
# Why the portal failed a run, kept with their values so that each reader sees them in their language.
NOT_STARTED = gettext_noop("No worker started the run within %(minutes)s minutes.")
NOT_FINISHED = gettext_noop("The run did not finish within %(minutes)s minutes.")
UNEXPECTED = gettext_noop("The run stopped on an unexpected error (%(kind)s); the worker's log tells more.")


def may_start_runs(user) -> bool:
    """Whether the user may ask for what-if runs (operators), not only read them."""
    return staff_may(user=user, permission=START_WHATIF)


def require_run_starter(user) -> None:
    require_staff_action(
        user=user,
        permission=START_WHATIF,
        refusal=_("Only operators start what-if runs; approvers may read them."),
    )


def start_whatif_run(
    *,
    user,
    month: str,
    cluster: str | None = None,
    changes: Sequence[tuple[str, str]] = (),
    now: datetime | None = None,
) -> WhatIfRun:
    """Keep a run of `month` (YYYY-MM) on `cluster` (None: every cluster) with `changes` ((kind, text) pairs,
    applied in order) and send it to a what-if worker. Keeps nothing and raises, saying what is wrong:
    NotAllowed for someone who is not an operator; one of BAD_INPUT for a bad change, month or cluster, or a
    change that names no node of today's fleet; InvalidInput for a changed fleet past WHATIF_MAX_GPUS;
    Conflict while the user has a run queued or running, or WHATIF_MAX_RUNNING runs are."""
    require_run_starter(user)
    pairs = [(kind, text.strip() if isinstance(text, str) else text) for kind, text in changes]
    if len(pairs) > MAX_CHANGES:
        raise FleetChangeError(f"At most {MAX_CHANGES} fleet changes make one run, not {len(pairs)}.")
    parsed = parse_changes(pairs)  # a misspelt change is refused before the database is read
    label, _start, _until = month_span(month, now=now)
    name = cluster or None
    nodes = fleet_nodes(cluster=name)  # an unknown cluster is refused here
    most = settings.WHATIF_MAX_GPUS
    # A node that is not there, GPUs for no clear cluster, a fleet past the cap: counted here, built by the
    # worker.
    if parsed and peak_size(nodes, parsed, cluster=name, limit=most) > most:
        raise InvalidInput(_(TOO_LARGE) % {"most": most}, field="add")
    now = now or timezone.now()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [START_LOCK])
        _check_runs_going(user)
        run = WhatIfRun.objects.create(
            month=label,
            cluster=name or "",
            changes=[list(pair) for pair in pairs],
            requested_by=user,
            deadline=now + timedelta(seconds=settings.WHATIF_RUN_SECONDS),
        )
        dispatch.after_commit(task_names.WHATIF_RUN, run.pk)
    log.info("what-if run %s asked for: %s, cluster %s, %d changes", run.pk, label, name or "all", len(pairs))
    return run


def _check_runs_going(user) -> None:
    """Refuse a new run while the user has one queued or running, or the portal runs as many as it may at
    once; under START_LOCK, so that two asks at once see each other. Runs past their deadline are failed by
    the sweeper, so neither limit holds for longer than WHATIF_RUN_SECONDS twice."""
    going = WhatIfRun.objects.filter(state__in=WHATIF_IN_BETWEEN)
    own = going.filter(requested_by=user).order_by("created_at", "pk").values_list("pk", flat=True).first()
    if own is not None:
        raise Conflict(
            _("Your what-if run #%(id)s is still queued or running; ask for another once it has ended.")
            % {"id": own}
        )
    most = settings.WHATIF_MAX_RUNNING
    if going.count() >= most:
        raise Conflict(
            _(
                "The portal runs at most %(most)s what-if runs at once, and as many are queued or running; "
                "ask again once one has ended."
            )
            % {"most": most}
        )


def execute_whatif_run(*, run_id: int, now: datetime | None = None) -> str:
    """Run a queued run to its end and say how it ended (its state; "gone" for a run that no longer
    exists). A run not queued is left as it is: another delivery of the task claimed it first, or the
    sweeper failed it. Whatever happens once it is claimed, it ends done or failed, unless the database
    itself cannot be reached, and then its deadline ends it."""
    with transaction.atomic():
        run = WhatIfRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return "gone"
        if run.state != WhatIfState.QUEUED:
            return str(run.state)
        started = now or timezone.now()
        _move(run, WhatIfState.RUNNING)
        run.started_at = started
        # The run's own deadline from its start: how long it may take, whatever it waited in the queue.
        run.deadline = started + timedelta(seconds=settings.WHATIF_RUN_SECONDS)
        run.save(update_fields=["state", "started_at", "deadline"])
    try:
        report = run_whatif(
            month=run.month,
            cluster=run.cluster_name,
            changes=run.change_pairs,
            progress=_progress(run.pk),
            max_gpus=settings.WHATIF_MAX_GPUS,
        )
    except FleetTooLarge as error:
        # Today's fleet grew since the run was asked for, or the cap was lowered: in the reader's language.
        data = {"template": TOO_LARGE, "params": {"most": error.most}}
        return _end(run.pk, WhatIfState.FAILED, error=audit.english(data), error_data=data)
    except (*BAD_INPUT, InvalidAnswer) as error:
        # The fleet may have changed since the run was asked for (a node gone), or the simulator broke a
        # rule: either way the page says so in the error's own words.
        return _end(run.pk, WhatIfState.FAILED, error=str(error))
    except Exception as error:
        log.exception("what-if run %s stopped on an unexpected error", run.pk)
        data = {"template": UNEXPECTED, "params": {"kind": type(error).__name__}}
        return _end(run.pk, WhatIfState.FAILED, error=audit.english(data), error_data=data)
    return _end(run.pk, WhatIfState.DONE, report=report)


def fail_overdue_runs(*, now: datetime | None = None) -> list[int]:
    """Fail every run queued or running past its deadline, saying which deadline it missed; the ids of
    those failed. A run whose row another transaction holds (its worker ending it) is left to it."""
    now = now or timezone.now()
    minutes = settings.WHATIF_RUN_SECONDS // 60
    failed = []
    overdue = WhatIfRun.objects.filter(state__in=WHATIF_IN_BETWEEN, deadline__lte=now).order_by(
        "deadline", "pk"
    )
    for run_id in overdue.values_list("pk", flat=True):
        with transaction.atomic():
            run = (
                WhatIfRun.objects.select_for_update(skip_locked=True)
                .filter(pk=run_id, state__in=WHATIF_IN_BETWEEN, deadline__lte=now)
                .first()
            )
            if run is None:
                continue
            template = NOT_STARTED if run.state == WhatIfState.QUEUED else NOT_FINISHED
            data = {"template": template, "params": {"minutes": minutes}}
            _move(run, WhatIfState.FAILED)
            run.error, run.error_data, run.finished_at = audit.english(data), data, now
            run.save(update_fields=["state", "error", "error_data", "finished_at"])
        log.warning("what-if run %s failed past its deadline", run_id)
        failed.append(run_id)
    return failed


def _move(run: WhatIfRun, to: str) -> None:
    """The one check of a run's transitions; the caller saves the new state in its transaction."""
    if to not in WHATIF_TRANSITIONS[run.state]:
        raise Conflict(
            _("What-if run #%(id)s is %(state)s; it cannot become %(to)s.")
            % {"id": run.pk, "state": WhatIfState(run.state).label, "to": WhatIfState(to).label}
        )
    run.state = to


def _progress(run_id: int) -> Callable[[float], None]:
    """What run_whatif tells its progress to: each value written at once, in its own short transaction
    outside the run's, so that the page shows it while the run goes on; only while the run is running."""

    def tell(done: float) -> None:
        share = min(max(float(done), 0.0), 1.0)
        WhatIfRun.objects.filter(pk=run_id, state=WhatIfState.RUNNING).update(progress=share)

    return tell


def _end(
    run_id: int, to: str, *, report: dict | None = None, error: str = "", error_data: dict | None = None
) -> str:
    """End a running run, under its row lock; one the sweeper failed meanwhile stays as it is."""
    with transaction.atomic():
        run = WhatIfRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            return "gone"
        if run.state != WhatIfState.RUNNING:
            return str(run.state)
        _move(run, to)
        run.report, run.error, run.error_data, run.finished_at = report, error, error_data, timezone.now()
        if to == WhatIfState.DONE:
            run.progress = 1.0
        run.save(update_fields=["state", "report", "error", "error_data", "finished_at", "progress"])
    log.info("what-if run %s %s", run_id, to)
    return str(to)
