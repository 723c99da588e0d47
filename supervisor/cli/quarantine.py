"""`supervise quarantine`: the GPUs and hosts jobs are kept away from, each with its expiry and
why; `--clear HOST[:GPU]` lifts one now (the whole host's with HOST)."""

from __future__ import annotations

import argparse
import time

from supervisor.cli._args import client as _client
from supervisor.core import formatting as _fmt
from supervisor.core import protocol


def cmd_quarantine(args: argparse.Namespace) -> int:
    client = _client()
    try:
        response = client.clear_quarantine(args.clear) if args.clear is not None else client.quarantine()
    finally:
        client.close()
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    if response.message:
        print(f"supervise: {response.message}")
    if not response.quarantined:
        print("nothing quarantined")
    for line in quarantine_lines(response.quarantined):
        print(line)
    return 0


def quarantine_lines(held: list[protocol.QuarantineInfo]) -> list[str]:
    """One line each: 'quarantined local:1 until 14:03:12 (in 59m): GPU 1: Xid 79: …'."""

    now = time.time()
    return [f"quarantined {q.place} until {_fmt.timestamp(q.until)} (in {_fmt.duration(max(0.0, q.until - now))}): "
            f"{q.reason}" for q in held]
