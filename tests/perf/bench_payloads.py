"""What a payload costs on the per-event path: made and turned into its stored JSON, and read back.

    .venv/bin/python tests/perf/bench_payloads.py --before /path/to/a/tree/of/main [--rounds 5]

Each round runs one child per tree (this tree, then ``--before``'s), alternating, each timing every
case with ``timeit`` (the best of 7 repeats, in µs per call); the table gives each case's median over
the rounds, after beside before.  A pydantic model of the same fields (made, then
``model_dump``) is timed in this tree's child as the comparator the choice of a dataclass codec
was made against.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import PY, machine_note, table

ROOT = Path(__file__).resolve().parents[2]

CHILD = r'''
import json, timeit
from typing import Any
from supervisor.core.events import Event, EventKind, JobState, Verdict
from supervisor.core.payloads import ActionData, ExitedData, LaunchedData, ProbeFields, StateData, VerdictData

evidence = {"probe": "tqdm.bar", "bar": "train", "done": 40, "total": 100, "bound_s": 60.0}
fields = {"done": 40, "total": 100, "unit": "it", "rate": 2.5, "desc": "train"}
kill = {"terminated": [[1, "python"], [2, "python"]], "killed": [], "survivors": [], "reparented": []}
cases = {
    "LaunchedData made + to_json": lambda: LaunchedData(12, ["python", "train.py"], "/l/a.log", "local").to_json(),
    "ExitedData made + to_json": lambda: ExitedData(1, None).to_json(),
    "VerdictData made + to_json": lambda: VerdictData(Verdict.STALLED, evidence).to_json(),
    "ActionData (a kill) made + to_json": lambda: ActionData(terminated=[(1, "python"), (2, "python")], killed=[],
                                                             survivors=[], reparented=[]).to_json(),
    "ActionData (one figure) made + to_json": lambda: ActionData(waited_s=0.5).to_json(),
    "StateData made + to_json": lambda: StateData(JobState.RUNNING, "attempt 1").to_json(),
    "ProbeFields made + to_json (a probe line)": lambda: ProbeFields(fields).to_json(),
}
events = {
    "ActionData.of (a kill)": (ActionData, Event(job="j", attempt=1, kind=EventKind.ACTION, message="m", data=kill)),
    "VerdictData.of": (VerdictData, Event(job="j", attempt=1, kind=EventKind.VERDICT, message="m",
                                          data={"verdict": "stalled", **evidence})),
    "ProbeFields.of (a probe line)": (ProbeFields, Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="m",
                                                         data=fields)),
}
for name, (reader, event) in events.items():
    cases[name] = (lambda r, e: lambda: r.of(e))(reader, event)

if PYDANTIC:
    from pydantic import BaseModel

    class LaunchedModel(BaseModel):
        pid: int | None
        argv: list[str]
        log: str | None
        host: str | None
        scheduler_id: str | None = None

    class ActionModel(BaseModel):
        reason: str | None = None
        held: bool | None = None
        down_s: float | None = None
        error: str | None = None
        events_per_attempt: int | None = None
        terminated: list[Any] | None = None
        killed: list[Any] | None = None
        survivors: list[Any] | None = None
        reparented: list[Any] | None = None
        released: bool | None = None
        woken_by: str | None = None
        sample_ts: float | None = None
        waited_s: float | None = None
        moved_from: str | None = None
        moved_to: str | None = None
        left_out: list[int] | None = None
        until: float | None = None
        checkpoint: str | None = None
        params: dict[str, str] | None = None

    cases["pydantic LaunchedData made + model_dump"] = lambda: LaunchedModel(
        pid=12, argv=["python", "train.py"], log="/l/a.log", host="local").model_dump(mode="json")
    cases["pydantic ActionData (a kill) made + model_dump"] = lambda: ActionModel(
        terminated=[(1, "python"), (2, "python")], killed=[], survivors=[], reparented=[]).model_dump(
        mode="json", exclude_none=True)
    cases["pydantic ActionData.of (a kill)"] = lambda: ActionModel.model_validate(kill)

out = {}
for name, call in cases.items():
    number = 20_000
    out[name] = min(timeit.repeat(call, number=number, repeat=7)) / number * 1e6
print(json.dumps(out))
'''


def run(tree: Path, pydantic: bool) -> dict[str, float]:
    code = f"PYDANTIC = {pydantic}\n" + CHILD
    done = subprocess.run([PY, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a tree of the code to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    after: dict[str, list[float]] = {}
    before: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, us in run(ROOT, True).items():
            after.setdefault(name, []).append(us)
        for name, us in run(args.before.resolve(), False).items():
            before.setdefault(name, []).append(us)
    rows = []
    for name, values in after.items():
        now = statistics.median(values)
        was = statistics.median(before[name]) if name in before else None
        rows.append((name, f"{now:.2f}", "-" if was is None else f"{was:.2f}",
                     "-" if was is None else f"{now - was:+.2f}", "-" if was is None else f"{now / was:.2f}×"))
    print(machine_note())
    print(f"{args.rounds} rounds, median of each case's best-of-7 µs per call\n")
    print(table(["case", "after µs", "before µs", "after − before µs", "after / before"], rows))


if __name__ == "__main__":
    main()
