"""What is taken beside the stacks at a hang verdict, before the kill: a torch distributed job's
flight recorder (hosts/flight_recorder.py: set up here at launch) and ``nvidia-smi -q`` where the
daemon sees GPUs (gpu/smi_report.py).  Both on this machine's attempts only, each bounded within
the stacks' own bound: nothing here holds the kill back longer than the stacks already may."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import structlog

from supervisor.core.host_url import is_local
from supervisor.gpu import smi_report
from supervisor.hosts import flight_recorder
from supervisor.hosts.stacks import StackDump
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.spec.model import JobSpec

log = structlog.get_logger("supervise.runner")


def wanted(spec: JobSpec, argv: list[str]) -> bool:
    """Whether the attempt gets a flight recorder folder: a local job whose command launches torch
    distributed ranks (``flight_recorder = "auto"``), or any local job that says ``"on"``."""
    if not is_local(spec.host) or spec.flight_recorder == "off":
        return False
    return spec.flight_recorder == "on" or flight_recorder.runs_torch_distributed(argv)


def prepare(spec: JobSpec, argv: list[str], log_path: str) -> dict[str, str]:
    """Before the launch (in a thread: it makes a folder): the flight recorder's environment."""
    if not wanted(spec, argv):
        return {}
    folder = flight_recorder.folder_for(log_path)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return flight_recorder.environment(folder, spec.env)


def _gpus_seen(ctx: RunnerContext) -> bool:
    sample = ctx.gpu.latest()
    return sample is not None and sample.available and bool(sample.devices)


async def taken_with(ctx: RunnerContext, live: Live, stacks: asyncio.Future[StackDump] | asyncio.Task[StackDump]) -> StackDump:
    """``stacks`` (under way) with the flight recorder's dumps and nvidia-smi -q beside it, taken
    at the same time."""
    local = is_local(live.row.host)
    folder = flight_recorder.folder_for(live.row.log_path)
    recorded = flight_recorder.collect(folder) if local else _nothing()
    smi = (smi_report.take(Path(live.row.log_path + ".nvidia-smi.txt"))
           if local and _gpus_seen(ctx) else _said(""))
    try:
        record, gpu_report = await asyncio.gather(recorded, smi)
    except Exception as exc:  # noqa: BLE001 - never in the way of the stacks, nor of the kill after them
        log.warning("flight recorder or nvidia-smi -q not taken", job=live.row.job, error=repr(exc))
        record, gpu_report = flight_recorder.FlightRecord(f"flight recorder: not read ({exc!r})"[:300]), ""
    dump = await stacks
    if record is None and not gpu_report:
        return dump
    return dataclasses.replace(dump, flight_recorder=record.summary if record else "",
                               dumps=record.dumps if record else (), gpu_report=gpu_report)


async def _nothing() -> flight_recorder.FlightRecord | None:
    return None


async def _said(text: str) -> str:
    return text
