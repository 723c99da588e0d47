"""What a payload costs on the per-event path: made and turned into its stored JSON, and read back.

    .venv/bin/python tests/perf/bench_payloads.py --before /path/to/a/tree/of/main [--repeats 41]

One process: this tree's ``supervisor/core/payloads.py`` and the one of ``--before``'s tree, loaded
beside it as a module of its own (its imports, ``core/events.py`` and ``core/progress.py``, are this
tree's: the comparison holds where those are the same).  Each case is timed with ``timeit`` in
blocks of 2,000 calls, in CPU time, after's block and before's alternating ``--repeats`` times, so that a
loaded machine disturbs both alike; the table gives each side's best block and median block in µs
per call.  A pydantic model of the same fields (made, then ``model_dump``; read by
``model_validate``) is timed beside them: the comparator the choice of a generated dataclass codec
was made against.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel

from supervisor.core import payloads
from supervisor.core.events import Event, EventKind, JobState, Verdict

EVIDENCE = {"probe": "tqdm.bar", "bar": "train", "done": 40, "total": 100, "bound_s": 60.0}
FIELDS = {"done": 40, "total": 100, "unit": "it", "rate": 2.5, "desc": "train"}
KILL = {"terminated": [[1, "python"], [2, "python"]], "killed": [], "survivors": [], "reparented": []}


def cases(m: ModuleType) -> dict[str, Callable[[], object]]:
    """The same calls against one payloads module."""
    kill_event = Event(job="j", attempt=1, kind=EventKind.ACTION, message="m", data=KILL)
    verdict_event = Event(job="j", attempt=1, kind=EventKind.VERDICT, message="m", data={"verdict": "stalled", **EVIDENCE})
    probe_event = Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="m", data=FIELDS)
    return {
        "LaunchedData made + to_json": lambda: m.LaunchedData(12, ["python", "train.py"], "/l/a.log", "local").to_json(),
        "ExitedData made + to_json": lambda: m.ExitedData(1, None).to_json(),
        "VerdictData made + to_json": lambda: m.VerdictData(Verdict.STALLED, EVIDENCE).to_json(),
        "ActionData (a kill) made + to_json": lambda: m.ActionData(
            terminated=[(1, "python"), (2, "python")], killed=[], survivors=[], reparented=[]).to_json(),
        "ActionData (one figure) made + to_json": lambda: m.ActionData(waited_s=0.5).to_json(),
        "StateData made + to_json": lambda: m.StateData(JobState.RUNNING, "attempt 1").to_json(),
        "ProbeFields made + to_json (a probe line)": lambda: m.ProbeFields(FIELDS).to_json(),
        "ActionData.of (a kill)": lambda: m.ActionData.of(kill_event),
        "VerdictData.of": lambda: m.VerdictData.of(verdict_event),
        "ProbeFields.of (a probe line)": lambda: m.ProbeFields.of(probe_event),
    }


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


PYDANTIC: dict[str, Callable[[], object]] = {
    "LaunchedData made + to_json": lambda: LaunchedModel(
        pid=12, argv=["python", "train.py"], log="/l/a.log", host="local").model_dump(mode="json"),
    "ActionData (a kill) made + to_json": lambda: ActionModel(
        terminated=[(1, "python"), (2, "python")], killed=[], survivors=[], reparented=[]).model_dump(
        mode="json", exclude_none=True),
    "ActionData.of (a kill)": lambda: ActionModel.model_validate(KILL),
}


def load(tree: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("payloads_before", tree / "supervisor" / "core" / "payloads.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def per_call(call: Callable[[], object], number: int = 2_000) -> float:
    # CPU time, not wall time: on a shared machine a block preempted halfway would count the other
    # processes' time as its own.
    return timeit.Timer(call, timer=time.process_time).timeit(number) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a tree of the code to compare against")
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args()
    after, before = cases(payloads), cases(load(args.before.resolve()))
    rows = []
    for name, call in after.items():
        times: dict[str, list[float]] = {"after": [], "before": [], "pydantic": []}
        for _ in range(args.repeats):
            times["after"].append(per_call(call))
            times["before"].append(per_call(before[name]))
            if name in PYDANTIC:
                times["pydantic"].append(per_call(PYDANTIC[name]))
        now, was = min(times["after"]), min(times["before"])
        model = f"{min(times['pydantic']):.2f}" if times["pydantic"] else "-"
        rows.append(f"| {name} | {now:.2f} | {was:.2f} | {now - was:+.2f} | {now / was:.2f}× | "
                    f"{statistics.median(times['after']):.2f} | {statistics.median(times['before']):.2f} | {model} |")
    print(f"Python {sys.version.split()[0]}; {args.repeats} alternating blocks of 2,000 calls per case; CPU µs per call\n")
    print("| case | after best | before best | after − before | after / before | after median | before median "
          "| pydantic best |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
