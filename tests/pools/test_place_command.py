"""`manage.py place`: a placement trace (docs/traces.md) in, valid placements out as JSON, bad input refused,
no database."""

import io
import json
import subprocess

import pytest
from django.core.management import CommandError, call_command

from pools.management.commands.place import Command
from pools.placement import Assignment, Placement, Reconfigure
from pools.placement.trace import read_trace
from tests.pools.test_placement import check_placement
from tests.pools.trace_commands import manage_command, run_command, write

# A MIG-disabled GPU, free, and a MIG GPU partly in use; one request for instances and a whole GPU together.
EXAMPLE = {
    "gpus": [
        {"id": "node-1/0", "node": "node-1", "model": "H100-80GB", "mig": False, "allocated": False},
        {"id": "node-1/1", "node": "node-1", "model": "H100-80GB", "mig": True,
         "instances": [{"profile": "3g.40gb", "start": 0, "allocated": True},
                       {"profile": "1g.10gb", "start": 4, "allocated": False}]},
    ],
    "requests": [
        {"id": "r1", "items": [{"model": "H100-80GB", "profile": "1g.10gb", "count": 2},
                               {"model": "H100-80GB", "profile": "full", "count": 1}]},
    ],
}  # fmt: skip
# A wholly free MIG GPU for r1 to re-partition, and a request that cannot fit after r1.
ROOMY = {
    "gpus": [*EXAMPLE["gpus"], {"id": "node-1/2", "node": "node-1", "model": "H100-80GB", "mig": True}],
    "requests": [
        *EXAMPLE["requests"],
        {"id": "r2", "items": [{"model": "H100-80GB", "profile": "4g.40gb", "count": 2}]},
    ],
}


def run(*args: str, stdin: str | None = None) -> tuple[str, str]:
    return run_command("place", *args, stdin=stdin)


def check_output(trace: dict, output: str) -> list[dict]:
    """The answer's shape exactly as docs/traces.md gives it, and placements that keep every rule on the
    trace's fleet."""
    results = json.loads(output)["results"]
    fleet, requests = read_trace(trace)
    assert [r["id"] for r in results] == [r.id for r in requests]
    for request, result in zip(requests, results, strict=True):
        if not result["placed"]:
            assert set(result) == {"id", "placed", "reason"} and result["reason"]
            placement = Placement(request.id, False, reason=result["reason"])
        else:
            assert set(result) == {"id", "placed", "reconfigure", "assignments"}
            for change in result["reconfigure"]:
                assert set(change) == {"gpu", "mig", "instances"}
                assert all(set(i) == {"profile", "start"} for i in change["instances"])
            for a in result["assignments"]:
                assert set(a) == (
                    {"gpu", "profile"} if a["profile"] == "full" else {"gpu", "profile", "start"}
                )
            placement = Placement(
                request.id,
                True,
                reconfigure=tuple(
                    Reconfigure(c["gpu"], c["mig"], tuple((i["profile"], i["start"]) for i in c["instances"]))
                    for c in result["reconfigure"]
                ),
                assignments=tuple(
                    Assignment(a["gpu"], a["profile"], a.get("start")) for a in result["assignments"]
                ),
            )
        fleet = check_placement(fleet, request, placement)
    return results


def test_the_example_is_answered_in_the_documented_shape(tmp_path):
    out, _ = run("--input", str(write(tmp_path, EXAMPLE)))
    (result,) = check_output(EXAMPLE, out)
    # The one free MIG-disabled GPU is the full GPU, and the other holds a single free 1g.10gb.
    assert result == {
        "id": "r1",
        "placed": False,
        "reason": "needs 1 × full H100-80GB and 2 × 1g.10gb together; the free H100-80GB capacity takes each "
        "alone but not all at once (1 wholly free GPU, the rest in use)",
    }


def test_a_trace_with_room_is_placed_and_the_rest_is_explained(tmp_path):
    out, _ = run("--input", str(write(tmp_path, ROOMY)))
    r1, r2 = check_output(ROOMY, out)
    assert r1["placed"] and [c["gpu"] for c in r1["reconfigure"]] == ["node-1/2"]
    assert {"gpu": "node-1/0", "profile": "full"} in r1["assignments"]
    assert {"gpu": "node-1/1", "profile": "1g.10gb", "start": 4} in r1["assignments"]  # free instance first
    assert r2 == {
        "id": "r2",
        "placed": False,
        "reason": "needs 2 × 4g.40gb; 1 placeable without re-partitioning in-use GPUs",
    }


def test_the_trace_can_come_from_standard_input():
    out, _ = run("--input", "-", stdin=json.dumps(ROOMY))
    assert [r["placed"] for r in check_output(ROOMY, out)] == [True, False]


def test_the_optional_gpu_fields_are_read_and_documented(tmp_path):
    trace = {
        "gpus": [
            {
                "id": "a/0",
                "node": "a",
                "model": "H100-80GB",
                "mig": False,
                "cluster": "east",
                "schedulable": False,
            },
            {
                "id": "b/0",
                "node": "b",
                "model": "H100-80GB",
                "mig": False,
                "cluster": "east",
                "group": "train",
            },
            {
                "id": "c/0",
                "node": "c",
                "model": "H100-80GB",
                "mig": True,
                "reconfiguring": True,
                "cluster": "west",
            },
        ],
        "requests": [
            {"id": "r", "group": "train", "items": [{"model": "H100-80GB", "profile": "full", "count": 1}]}
        ],
    }
    out, _ = run("--input", str(write(tmp_path, trace)))
    (result,) = check_output(trace, out)
    assert result["assignments"] == [{"gpu": "b/0", "profile": "full"}]
    help_text = Command().create_parser("manage.py", "place").format_help()
    for field in ("cluster", "schedulable", "reconfiguring", "group"):
        assert field in help_text


def _gpu(**fields: object) -> dict:
    return {"id": "n/0", "node": "n", "model": "H100-80GB", "mig": True, **fields}


def _request(**fields: object) -> dict:
    return {"id": "r", "items": [{"model": "H100-80GB", "profile": "1g.10gb", "count": 1, **fields}]}


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ("{not json", "is not valid JSON: Expecting property name enclosed in double quotes at line 1"),
        ([], 'A trace is a JSON object with "gpus" and "requests", not a list.'),
        ({"requests": []}, 'the trace: "gpus" must be a list, got nothing.'),
        ({"gpus": [_gpu(model="X100")]}, "gpus[0] ('n/0'): Unknown GPU model 'X100'"),
        ({"gpus": [_gpu(mig="yes")]}, "gpus[0] ('n/0'): \"mig\" must be true or false, got a string."),
        (
            {"gpus": [_gpu(instances=[{"profile": "4g.40gb", "start": 2}])]},
            "gpus[0] ('n/0'): this layout does not fit on one H100-80GB: 4g.40gb at 2: 4g.40gb can start",
        ),
        (
            {"gpus": [_gpu(mig=False, instances=[{"profile": "1g.10gb", "start": 0}])]},
            "gpus[0] ('n/0'): MIG is off, so it cannot have MIG instances.",
        ),
        ({"gpus": [_gpu(), _gpu()]}, "GPU id 'n/0' appears more than once in \"gpus\"."),
        ({"gpus": [_gpu(mig=False, sharing="ts-9")]}, "gpus[0] ('n/0'): \"sharing\" 'ts-9' is no share mode"),
        ({"gpus": [_gpu(mig=False, sharing="slices")]}, "\"sharing\" 'slices' is no share mode"),
        (
            {"gpus": [_gpu(mig=False, sharing="ts-2", instances=[{"profile": "ts-2", "start": 0}])]},
            "in share mode ts-2 a GPU has the shares ts-2 at 0 to 1, each once.",
        ),
        (
            {"gpus": [_gpu(mig=False, sharing="ts-2", allocated=True)]},
            'a shared GPU is in use through its shares, not "allocated".',
        ),
        (
            {"gpus": [_gpu(mig=False, sharing="ts-2"), _gpu(id="n/1", mig=False)]},
            "GPU 'n/1': node 'n' is in share modes ts-2 and none",
        ),
        ({"gpus": [_gpu(offers=["whole", "ts-9"])]}, "gpus[0] ('n/0'): \"offers\": 'ts-9': a GPU is shared"),
        (
            {"gpus": [_gpu(model="L40S-48GB", instances=[])]},
            "the MIG catalogue has no geometry for L40S-48GB",
        ),
        ({"gpus": [], "requests": [_request(profile="9g.99gb")]}, "H100-80GB has no MIG profile '9g.99gb'"),
        ({"gpus": [], "requests": [_request(model="X100")]}, "Unknown GPU model 'X100'"),
        (
            {"gpus": [], "requests": [_request(count=0)]},
            "requests[0] ('r'): Item 1 of request 'r': the count must be a whole number above 0 (got 0).",
        ),
        ({"gpus": [], "requests": [_request(count=1.5)]}, '"count" must be a whole number, got 1.5.'),
        ({"gpus": [], "requests": [_request(), _request()]}, "Request id 'r' appears more than once"),
    ],
)
def test_bad_input_is_refused_clearly_with_nothing_on_standard_output(tmp_path, trace, message):
    path = write(tmp_path, trace)
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command("place", "--input", str(path), stdout=out)
    assert message in str(refused.value)
    assert str(refused.value).startswith(str(path))
    assert out.getvalue() == ""


@pytest.mark.parametrize("command", ["place", "simulate"])  # one reader serves both
def test_an_unreadable_file_is_refused(tmp_path, command):
    with pytest.raises(CommandError, match=r"Cannot read .*missing\.json: No such file or directory\."):
        run_command(command, "--input", str(tmp_path / "missing.json"))
    write(tmp_path, "", "binary.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CommandError, match="it is not UTF-8 text"):
        run_command(command, "--input", str(tmp_path / "binary.json"))


def manage(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return manage_command("place", *args, stdin=stdin)


def test_the_command_runs_as_a_process_without_a_database(tmp_path):
    done = manage("--input", str(write(tmp_path, ROOMY)))
    assert done.returncode == 0, done.stderr
    assert [r["placed"] for r in check_output(ROOMY, done.stdout)] == [True, False]
    done = manage("--input", "-", stdin=json.dumps(EXAMPLE))
    assert done.returncode == 0, done.stderr
    check_output(EXAMPLE, done.stdout)


def test_a_process_given_bad_input_fails_with_a_message_and_no_output(tmp_path):
    done = manage("--input", str(write(tmp_path, {"gpus": [_gpu(), _gpu()]})))
    assert done.returncode != 0
    assert done.stdout == ""
    assert "GPU id 'n/0' appears more than once" in done.stderr


def test_shares_are_placed_on_a_shared_node_and_a_free_node_is_put_in_the_mode(tmp_path):
    trace = {
        "gpus": [
            _gpu(id="l/0", node="l", model="L40S-48GB", mig=False, sharing="ts-4", offers=["ts-4"]),
            _gpu(id="a/0", node="a", model="L40S-48GB", mig=False, offers=["ts-4"]),
        ],
        "requests": [
            {"id": "r1", "items": [{"model": "L40S-48GB", "profile": "ts-4", "count": 6}]},
            {"id": "r2", "items": [{"model": "L40S-48GB", "profile": "full", "count": 1}]},
        ],
    }
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    out = io.StringIO()
    call_command("place", "--input", str(path), stdout=out)
    first, second = json.loads(out.getvalue())["results"]
    assert [(a["gpu"], a["start"]) for a in first["assignments"]] == [
        ("l/0", 0),
        ("l/0", 1),
        ("l/0", 2),
        ("l/0", 3),
        ("a/0", 0),
        ("a/0", 1),
    ]
    assert first["reconfigure"] == [
        {
            "gpu": "a/0",
            "mig": False,
            "sharing": "ts-4",
            "instances": [{"profile": "ts-4", "start": n} for n in range(4)],
        }
    ]
    assert second == {"id": "r2", "placed": False, "reason": "no L40S-48GB GPU is offered as full"}
