"""The report's chart marks a kill from the action's stored kill report, never from its wording:
a stop of an attempt no runner watched signals processes as much as an unhealthy attempt's kill,
and its sentence begins otherwise."""

from __future__ import annotations

from typing import Any

from supervisor.cli import report
from supervisor.core import protocol
from supervisor.core.events import EventKind
from supervisor.core.payloads import ActionData


class _Axis:
    """Records the markers a report would draw (matplotlib's ``Axes.plot`` keywords)."""

    def __init__(self) -> None:
        self.markers: list[str] = []

    def plot(self, *args: Any, **kwargs: Any) -> None:
        self.markers.append(kwargs["marker"])


def _action(message: str, data: ActionData) -> protocol.EventInfo:
    return protocol.EventInfo(id=1, job="j", attempt=1, ts=1_700_000_000.0, kind=EventKind.ACTION, probe=None,
                              phase=None, offset=None, message=message, data=data.to_json())


def _markers(event: protocol.EventInfo) -> list[str]:
    axis = _Axis()
    report._event_marker(axis, event, lane=0)
    return axis.markers


def test_a_kill_is_marked_by_its_report_whatever_its_sentence() -> None:
    killed = ActionData(terminated=[[41, "python train.py"]], killed=[], survivors=[])
    assert _markers(_action("killed the process tree: 1 ended on SIGTERM", killed)) == ["v"]
    assert _markers(_action("stopped by user (it was running unwatched): 1 ended on SIGTERM", killed)) == ["v"]


def test_an_empty_kill_report_is_still_a_kill() -> None:
    # The tree had already gone when the kill came: the report is stored, empty.
    assert _markers(_action("killed the process tree: nothing left", ActionData(terminated=[], killed=[]))) == ["v"]


def test_actions_that_signal_nothing_are_not_kills() -> None:
    for message, data in [("killed the process tree? no: held by user", ActionData(held=True)),
                          ("GPU memory released after 2.0s", ActionData(released=True, waited_s=2.0)),
                          ("relaunch in 4.0s", ActionData())]:
        assert _markers(_action(message, data)) == [], message


def test_give_up_keeps_its_own_marker() -> None:
    assert _markers(_action("give up: same failure twice", ActionData())) == ["X"]
