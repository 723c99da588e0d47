"""Which of the supervisor's files one log line's trip enters: from the follower's read of it to its
stored event, and to the attempt's verdict.

    .venv/bin/python tests/perf/trip_files.py

A daemon in this process (its real store and local host) runs one job that prints one failure
line and exits 1; every call into a module under supervisor/ is recorded (sys.setprofile on
every thread) from just before the line is written until the attempt has ended.  The window
also holds what runs beside the line (the exit watch, the cgroup read), so the count is an
upper bound.  Prints the files and those entered more than once (a call into the file after a
call elsewhere), and how many times the watch (`_watching.py`) and the store (`store/*`) are entered.
"""
import asyncio
import shutil
import sys
import tempfile
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from supervisor.cli.client import Client
from supervisor.core.config import DaemonSettings, Paths
from supervisor.daemon.service import Service

home = Path(tempfile.mkdtemp(prefix="trip-"))
script = home / "one.py"
script.write_text(textwrap.dedent("""\
    import sys, time
    time.sleep(1.0)
    print("RuntimeError: CUDA error: an illegal memory access was encountered", flush=True)
    time.sleep(1.0)
    sys.exit(1)
    """))
spec = home / "one.toml"
spec.write_text(f'name = "one"\ncommand = ["{{python}}", "{script}"]\nprobes = ["python"]\n')
trace = []  # (thread, file, func) in order of calls
ROOT = str(REPO / "supervisor") + "/"
armed = [False]

def prof(frame, event, arg):
    if event != "call" or not armed[0]:
        return
    f = frame.f_code.co_filename
    if f.startswith(ROOT):
        thread = threading.current_thread()
        task = None
        if thread is threading.main_thread():
            try:
                current = asyncio.current_task()
            except RuntimeError:
                current = None
            task = None if current is None else current.get_name()
        trace.append((thread.name, f[len(ROOT):], frame.f_code.co_name, time.monotonic(), task))

async def run():
    service = Service(Paths(home), DaemonSettings())
    serving = asyncio.create_task(service.serve())
    client = Client(Paths(home))
    for _ in range(500):
        if Paths(home).pid_file.exists():
            break
        await asyncio.sleep(0.02)
    await asyncio.to_thread(client.start, str(spec), {})
    await asyncio.sleep(0.6)
    threading.setprofile(prof)
    sys.setprofile(prof)
    armed[0] = True
    for _ in range(400):
        row = service.store.latest_attempt("one")
        if row is not None and not row.state.active:
            break
        await asyncio.sleep(0.02)
    armed[0] = False
    sys.setprofile(None)
    threading.setprofile(None)
    client.close()
    service.request_stop()
    await asyncio.wait_for(serving, 30)

asyncio.run(run())
# the line's trip: from the follower's read of it to the event's commit
def span(start_pred, end_pred):
    i = next(k for k, t in enumerate(trace) if start_pred(t))
    j = next(k for k in range(i, len(trace)) if end_pred(trace[k]))
    return trace[i:j + 1]
def on_the_path(t):
    """A call the line's own trip makes: the attempt's reader and job tasks, the job's ordered
    writes, the matcher's thread; not the exit watch, the program finder, the daemon's other
    tasks, nor this script's own polling of the store."""
    thread, task = t[0], t[4]
    if thread != threading.main_thread().name:
        return True  # the matcher's thread (its only other threads here are the store's)
    return task is not None and task.split(":")[0] in ("read", "job", "writes")
def report(name, seg):
    files = [t[1] for t in seg]
    seq = [f for k, f in enumerate(files) if k == 0 or files[k - 1] != f]
    c = Counter(seq)
    print(f"{name}: {len(set(files))} files; entered more than once: {[(f, n) for f, n in c.items() if n > 1]}")
    store = sum(n for f, n in c.items() if f.startswith("store/"))
    print(f"    jobs/runner/_watching.py entered {c['jobs/runner/_watching.py']} times; the store (store/*) entered {store} times")
    print("   ", sorted(set(files)))
stored = span(lambda t: t[1] == "hosts/local/follow.py" and t[2] == "_pump", lambda t: t[1] == "store/database.py" and t[2] == "record_events")
report("follower -> stored event", stored)
verdict = span(lambda t: t[1] == "hosts/local/follow.py" and t[2] == "_pump", lambda t: t[2] == "record_verdict")
report("follower -> verdict", verdict)
print("only the line's own path (its reader, job and write tasks and the matcher's thread):")
report("  follower -> stored event", [t for t in stored if on_the_path(t)])
report("  follower -> verdict", [t for t in verdict if on_the_path(t)])
shutil.rmtree(home, ignore_errors=True)
if "--calls" in sys.argv:
    seg = [t for t in stored if on_the_path(t)]
    print(Counter(f"{t[1]}:{t[2]}" for t in seg).most_common(40))
