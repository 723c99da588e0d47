"""A job for the benchmarks: writes stamped lines to stdout at a steady rate.

    _writer.py --rate LINES_PER_S --lines N [--event-every K] [--loss-every M] [--access-log]
               [--phase F] [--go FILE] [--ready DIR] [--linger]

Every line starts with the ``time.time()`` taken just before it is written (one write and a
flush per line).  Every K-th line is a transformers shard bar, which the ``transformers``
pack turns into a progress event:

    1733000000.123456 Loading checkpoint shards:  50%|#####     | 5/10 [00:05<00:05,  1.00s/it]

the others are plain worker lines that no built-in probe matches.  With ``--loss-every M`` every
M-th line is a transformers loss line instead (a metric event each, stored every time):

    1733000000.123456 {'loss': 17.0, 'learning_rate': 1e-05, 'epoch': 0.1}

With ``--access-log`` the plain lines are a vLLM server's access log, one line per request (the
``vllm`` pack reads each as a request answered):

    1733000000.123456 INFO:     127.0.0.1:40312 - "POST /v1/completions HTTP/1.1" 200 OK
  With ``--go`` the writer
waits for FILE to appear and starts at the instant written in it, so that many writers
start together.  ``--linger`` keeps the process alive after the last line (until killed),
so the supervisor's end-of-attempt work stays out of a measurement window.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--lines", type=int, required=True)
    parser.add_argument("--event-every", type=int, default=1)
    parser.add_argument("--loss-every", type=int, default=0, help="every M-th line a loss line (0: none)")
    parser.add_argument("--access-log", action="store_true", help="the plain lines are vLLM access-log lines")
    parser.add_argument("--go")
    parser.add_argument("--phase", type=float, default=0.0,
                        help="offset of this writer's lines, in line periods (0..1), so many writers do not write in step")
    parser.add_argument("--ready", help="a directory: touch DIR/<pid> once waiting for --go")
    parser.add_argument("--linger", action="store_true")
    args = parser.parse_args()

    start = time.time()
    if args.ready:
        open(os.path.join(args.ready, str(os.getpid())), "w").close()
    if args.go:
        while not os.path.exists(args.go):
            time.sleep(0.05)
        with open(args.go) as handle:
            start = max(float(handle.read().strip()), time.time())  # a late writer does not burst
    every = max(1, args.event_every)
    loss_every = max(0, args.loss_every)

    def is_loss(i: int) -> bool:
        return loss_every > 0 and (i + 1) % loss_every == 0

    bars = sum(1 for i in range(args.lines) if not is_loss(i) and (i + 1) % every == 0)
    losses = 0
    out = sys.stdout.buffer
    done = 0
    while time.time() < start:
        time.sleep(max(0.0, start - time.time()))
    for i in range(args.lines):
        due = start + (i + args.phase) / args.rate
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        if is_loss(i):
            losses += 1
            text = f"{{'loss': {losses}.0, 'learning_rate': 1e-05, 'epoch': 0.1}}"
        elif (i + 1) % every == 0:
            done += 1
            pct = 100 * done // max(bars, 1)
            bar = "#" * (pct // 10)
            text = f"Loading checkpoint shards: {pct:3d}%|{bar:<10}| {done}/{bars} [00:05<00:05,  1.00s/it]"
        elif args.access_log:
            text = f'INFO:     127.0.0.1:{40000 + i % 20000} - "POST /v1/completions HTTP/1.1" 200 OK'
        else:
            text = f"worker 3: processed batch {i} of {args.lines} (4096 tokens)"
        out.write(f"{time.time():.6f} {text}\n".encode())
        out.flush()
    while args.linger:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
