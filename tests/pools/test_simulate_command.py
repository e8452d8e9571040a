"""`manage.py simulate`: a simulation trace (docs/traces.md) in, admissions out as JSON, a summary on standard
error, bad input refused with a message and nothing on standard output, no database."""

import io
import json
import subprocess

import pytest
from django.core.management import CommandError, call_command

from pools.management.commands.simulate import Command
from pools.placement import Assignment, Placement, Reconfigure
from pools.placement.replay import check
from pools.placement.simulation import Outcome
from pools.placement.timetrace import read_simulation_trace
from tests.pools.trace_commands import manage_command, run_command, write


def _inference(gpu: dict) -> dict:
    return {**gpu, "group": "inference"}


# The placement tests' GPUs and a wholly free MIG GPU, all in r1's group; r1 comes first and gets the free
# GPU re-partitioned, r2 waits for r1's day to end, and no A100 exists for r3.
TRACE = {
    "gpus": [
        _inference(gpu)
        for gpu in (
            {"id": "node-1/0", "node": "node-1", "model": "H100-80GB", "mig": False, "allocated": False},
            {"id": "node-1/1", "node": "node-1", "model": "H100-80GB", "mig": True,
             "instances": [{"profile": "3g.40gb", "start": 0, "allocated": True},
                           {"profile": "1g.10gb", "start": 4, "allocated": False}]},
            {"id": "node-1/2", "node": "node-1", "model": "H100-80GB", "mig": True},
        )
    ],
    "horizon": 604800,
    "backfill_grace_seconds": None,
    "requests": [
        {"id": "r1", "arrive": 120, "hold": 86400,
         "items": [{"model": "H100-80GB", "profile": "3g.40gb", "count": 2}], "group": "inference"},
        {"id": "r2", "arrive": 600, "hold": 3600,
         "items": [{"model": "H100-80GB", "profile": "7g.80gb", "count": 2}]},
        {"id": "r3", "arrive": 900, "hold": 60,
         "items": [{"model": "A100-40GB", "profile": "full", "count": 1}]},
    ],
}  # fmt: skip


def run(*args: str, stdin: str | None = None) -> tuple[str, str]:
    return run_command("simulate", *args, stdin=stdin)


def check_output(trace: dict, output: str) -> list[dict]:
    """The answer's shape exactly as docs/traces.md gives it, and admissions that keep every rule when
    replayed on the trace."""
    results = json.loads(output)["results"]
    simulation = read_simulation_trace(trace)
    assert [r["id"] for r in results] == [r.id for r in simulation.requests]
    outcomes = []
    for result in results:
        if result["admitted_at"] is None:
            assert set(result) == {"id", "admitted_at"}
            outcomes.append(Outcome(result["id"], None, Placement(result["id"], False, reason="waits")))
            continue
        assert set(result) == {"id", "admitted_at", "reconfigure", "assignments"}
        for change in result["reconfigure"]:
            assert set(change) == {"gpu", "mig", "instances"}
            assert all(set(i) == {"profile", "start"} for i in change["instances"])
        for a in result["assignments"]:
            assert set(a) == ({"gpu", "profile"} if a["profile"] == "full" else {"gpu", "profile", "start"})
        placement = Placement(
            result["id"],
            True,
            reconfigure=tuple(
                Reconfigure(c["gpu"], c["mig"], tuple((i["profile"], i["start"]) for i in c["instances"]))
                for c in result["reconfigure"]
            ),
            assignments=tuple(
                Assignment(a["gpu"], a["profile"], a.get("start")) for a in result["assignments"]
            ),
        )
        outcomes.append(Outcome(result["id"], result["admitted_at"], placement))
    assert check(simulation, outcomes) == []
    return results


def test_the_trace_is_answered_in_the_documented_shape_with_a_summary(tmp_path):
    out, err = run("--input", str(write(tmp_path, TRACE)))
    r1, r2, r3 = check_output(TRACE, out)
    # The wholly free GPU cut into two 3g.40gb, both given to r1.
    assert r1 == {
        "id": "r1",
        "admitted_at": 120,
        "reconfigure": [
            {
                "gpu": "node-1/2",
                "mig": True,
                "instances": [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}],
            }
        ],
        "assignments": [
            {"gpu": "node-1/2", "profile": "3g.40gb", "start": 0},
            {"gpu": "node-1/2", "profile": "3g.40gb", "start": 4},
        ],
    }
    assert r2["admitted_at"] == 120 + 86400  # two wholly free GPUs only once r1 gives node-1/2 back
    assert r3 == {"id": "r3", "admitted_at": None}
    lines = err.splitlines()
    # r1: 6 compute slices for 24 h; r2: 14 for 1 h. Waits 0 and 86520 - 600.
    assert lines[:3] == [
        "served: 158.0 compute-slice-hours",
        "admitted: 2 of 3 requests",
        "wait of admitted requests: mean 42960 s, p95 85920 s",
    ]
    assert lines[3].startswith("stranded compute slices over 5 event times: min ")
    assert lines[3].endswith(f"(at {86520 + 3600} s)")
    assert lines[4].startswith("run time: ") and lines[4].endswith(" s")


def test_the_trace_can_come_from_standard_input():
    out, _ = run("--input", "-", stdin=json.dumps(TRACE))
    assert [r["admitted_at"] for r in check_output(TRACE, out)] == [120, 86520, None]


def _full(count: int) -> dict:
    return {"model": "H100-80GB", "profile": "full", "count": count}


def test_the_grace_of_the_trace_holds_back_a_competitor():
    trace = {
        "gpus": [{"id": f"n/{n}", "node": "n", "model": "H100-80GB", "mig": False} for n in range(2)],
        "horizon": 1000,
        "backfill_grace_seconds": 5,
        "requests": [
            {"id": "holder", "arrive": 0, "hold": 100, "items": [_full(1)]},
            {"id": "big", "arrive": 10, "hold": 100, "items": [_full(2)]},
            {"id": "late", "arrive": 20, "hold": 10, "items": [_full(1)]},
        ],
    }
    out, _ = run("--input", "-", stdin=json.dumps(trace))
    assert [r["admitted_at"] for r in check_output(trace, out)] == [0, 100, 200]
    out, _ = run("--input", "-", stdin=json.dumps({**trace, "backfill_grace_seconds": None}))
    assert [r["admitted_at"] for r in check_output(trace, out)] == [0, 100, 20]


def test_the_help_says_input_is_required_and_names_the_fields():
    help_text = " ".join(Command().create_parser("manage.py", "simulate").format_help().split())
    assert "--input is required" in help_text
    for field in ("horizon", "backfill_grace_seconds", "arrive", "hold", "group"):
        assert field in help_text
    with pytest.raises(CommandError, match="one of the arguments --input is required"):
        run()


def _gpu(**fields: object) -> dict:
    return {"id": "n/0", "node": "n", "model": "H100-80GB", "mig": True, **fields}


def _request(id: str = "r", arrive: object = 0, **fields: object) -> dict:
    items = [{"model": "H100-80GB", "profile": "1g.10gb", "count": 1}]
    return {"id": id, "arrive": arrive, "hold": 60, "items": items, **fields}


def _trace(**fields: object) -> dict:
    return {"gpus": [_gpu()], "horizon": 3600, "requests": [_request()], **fields}


def _item(**fields: object) -> dict:
    return _trace(
        requests=[_request(items=[{"model": "H100-80GB", "profile": "1g.10gb", "count": 1, **fields}])]
    )


SECONDS = "a whole number of seconds, 0 or more"


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
        ([], 'A simulation trace is a JSON object with "gpus", "horizon" and "requests", not a list.'),
        ({"horizon": 1, "requests": []}, 'the trace: "gpus" must be a list, got nothing.'),
        (_trace(gpus=[_gpu(), _gpu()]), "GPU id 'n/0' appears more than once in \"gpus\"."),
        (_trace(gpus=[_gpu(model="X100")]), "gpus[0] ('n/0'): Unknown GPU model 'X100'"),
        (
            {"gpus": [], "requests": []},
            'the trace: "horizon" must be a whole number of seconds above 0, got nothing.',
        ),
        (_trace(horizon=0), '"horizon" must be a whole number of seconds above 0, got 0.'),
        (_trace(horizon=1.5), '"horizon" must be a whole number of seconds above 0, got 1.5.'),
        (_trace(horizon="week"), '"horizon" must be a whole number of seconds above 0, got a string.'),
        (_trace(horizon=True), '"horizon" must be a whole number of seconds above 0, got true or false.'),
        (
            _trace(backfill_grace_seconds=-1),
            f'the trace: "backfill_grace_seconds" must be null or {SECONDS}, got -1.',
        ),
        (
            _trace(backfill_grace_seconds="1h"),
            f'"backfill_grace_seconds" must be null or {SECONDS}, got a string.',
        ),
        ({"gpus": [], "horizon": 1}, 'the trace: "requests" must be a list, got nothing.'),
        (_trace(requests=[_request(arrive=-1)]), f"requests[0] ('r'): \"arrive\" must be {SECONDS}, got -1."),
        (
            _trace(requests=[_request(arrive=None)]),
            f"requests[0] ('r'): \"arrive\" must be {SECONDS}, got null.",
        ),
        (_trace(requests=[_request(hold=2.5)]), f"requests[0] ('r'): \"hold\" must be {SECONDS}, got 2.5."),
        (
            _trace(requests=[{k: v for k, v in _request().items() if k != "hold"}]),
            f"requests[0] ('r'): \"hold\" must be {SECONDS}, got nothing.",
        ),
        (
            _trace(requests=[_request("a", 10), _request("b", 5)]),
            "requests[1] ('b'): \"arrive\" is 5, before the 10 of the request before it ('a'); "
            "requests must be in arrival order.",
        ),
        (
            _trace(requests=[_request("a"), _request("a")]),
            "requests[1] ('a'): request id 'a' appears more than once in \"requests\" "
            "(first at requests[0]).",
        ),
        (
            _trace(requests=[_request(id="")]),
            'requests[0]: "id" must be a non-empty string, got an empty string.',
        ),
        (_item(model="X100"), "requests[0] ('r'): Item 1 of request 'r': Unknown GPU model 'X100'"),
        (_item(count=0), "Item 1 of request 'r': the count must be a whole number above 0 (got 0)."),
        (
            _trace(requests=[_request(group=3)]),
            "requests[0] ('r'): \"group\" must be a string or null, got a number.",
        ),
    ],
)
def test_bad_input_is_refused_clearly_with_nothing_on_standard_output(tmp_path, trace, message):
    path = write(tmp_path, trace)
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("simulate", "--input", str(path), stdout=out, stderr=io.StringIO())
    assert message in str(refused.value)
    assert str(refused.value).startswith(str(path))
    assert out.getvalue() == ""


def manage(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return manage_command("simulate", *args, stdin=stdin)


def test_the_command_runs_as_a_process_without_a_database(tmp_path):
    done = manage("--input", str(write(tmp_path, TRACE)))
    assert done.returncode == 0, done.stderr
    assert [r["admitted_at"] for r in check_output(TRACE, done.stdout)] == [120, 86520, None]
    assert "admitted: 2 of 3 requests" in done.stderr
    done = manage("--input", "-", stdin="[]")
    assert done.returncode != 0
    assert done.stdout == ""
    assert "A simulation trace is a JSON object" in done.stderr
