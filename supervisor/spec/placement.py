"""Where each shard of a sharded job runs: its host (`hosts`, round robin) and, with
`gpu.devices_per_shard`, its own group of the box's devices (CUDA_VISIBLE_DEVICES).

Shard i goes to ``hosts[i % len(hosts)]`` (the job's `host` when `hosts` is empty) and takes the
``i // len(hosts)``-th group of ``devices_per_shard`` devices there: the same spec always places
the same shard the same way, so a relaunched shard finds its own devices again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Placement:
    shard: int
    host: str
    devices: tuple[int, ...] | None  # None: the job's `gpu.devices` as written (no per-shard split)


def check_placement(shards: int, hosts: Sequence[str], devices: Sequence[int] | Literal["all"],
                    per_shard: int | None) -> None:
    """ValueError (one line, in the spec's terms) unless every shard has a place."""
    if len(set(hosts)) != len(hosts):
        raise ValueError("`hosts` names a host twice; list each once (shards are spread over them in turn)")
    if per_shard is None:
        return
    if devices == "all":
        raise ValueError("gpu.devices_per_shard needs gpu.devices listed (e.g. devices = [0, 1, 2, 3]) "
                         "to split them between shards")
    if len(devices) % per_shard:
        raise ValueError(f"gpu.devices_per_shard = {per_shard} does not divide the {len(devices)} devices of "
                         "gpu.devices; use a divisor of their number")
    groups = len(devices) // per_shard
    busiest = -(-shards // max(1, len(hosts)))  # shards on the host that gets the most
    if busiest > groups:
        raise ValueError(f"shards = {shards} put {busiest} shards on one host, but gpu.devices holds {groups} "
                         f"group(s) of {per_shard}: lower shards, add hosts or list more devices")


def place(shards: int, host: str, hosts: Sequence[str], devices: Sequence[int] | Literal["all"],
          per_shard: int | None) -> list[Placement]:
    spread = list(hosts) or [host]
    placements = []
    for shard in range(shards):
        group = shard // len(spread)
        mine = None
        if per_shard is not None and devices != "all":
            mine = tuple(devices[group * per_shard:(group + 1) * per_shard])
        placements.append(Placement(shard, spread[shard % len(spread)], mine))
    return placements
