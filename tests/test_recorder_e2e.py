"""One recorder writes every event, store first, then bus: a job's state changes are events,
stored with the job's row and in order with its attempts' events, and a follower of the bus
sees them as they happen."""

from __future__ import annotations

import threading

from conftest import DaemonProcess, wait_until
from e2e_jobs import PROGRESS_JOB, job_state

from supervisor.core import protocol


def test_each_job_state_change_is_an_event_stored_in_order(daemon: DaemonProcess, make_job) -> None:
    client = daemon.client()
    client.start(str(make_job("steps", PROGRESS_JOB, params=', "4", "0.01"')), {})
    wait_until(lambda: job_state(client, "steps") == "done")
    events = client.events("steps").events
    states = [e for e in events if e.kind == "state"]
    # Numbered with the job's latest attempt: none yet when it is stored as starting.
    assert [(e.attempt, e.data["state"]) for e in states] == [(0, "starting"), (1, "running"), (1, "done")], states
    kinds = [e.kind for e in events]
    assert kinds.index("launched") > kinds.index("state") and kinds[-1] == "state", kinds  # running, then launched
    assert kinds.index("exited") < len(kinds) - 1  # the job's end is recorded after its attempt's
    job = client.status("steps").jobs[0]
    assert (job.state, job.reason) == (states[-1].data["state"], states[-1].data["reason"])


def test_a_follower_of_the_bus_sees_the_state_a_stop_records(daemon: DaemonProcess, make_job, home) -> None:
    client = daemon.client()
    gate = home / "never"  # the bar holds halfway until this file exists: it never does
    client.start(str(make_job("held", PROGRESS_JOB, params=f', "8", "0.01", "{gate}"')), {})
    wait_until(lambda: any(e.kind == "progress" for e in client.events("held").events))
    seen: list[protocol.EventInfo] = []
    following = threading.Thread(target=lambda: seen.extend(daemon.client().follow_events("held", until_done=True)))
    following.start()
    wait_until(lambda: any(e.kind == "launched" for e in seen))  # the backlog is read: the stream is on the bus now
    client.stop("held", None)
    following.join(timeout=60)
    assert not following.is_alive()
    streamed = [e.data["state"] for e in seen if e.kind == "state"]
    assert streamed[-1] == "stopped" and streamed[:2] == ["starting", "running"], streamed
    ids = [e.id for e in seen]
    assert ids == sorted(set(ids))  # once each, in the order stored
    # Every stored event streamed, but a bar's latest line (stored in place of the one before, never sent).
    assert {e.id for e in client.events("held").events if e.kind != "progress"} <= set(ids)
