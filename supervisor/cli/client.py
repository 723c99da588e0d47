"""The CLI's side of the control API: HTTP over the daemon's Unix socket, typed by protocol.py.

Starts the daemon in the background when none answers.  Transport errors are translated
into `DaemonError`s here, where they enter; an error the daemon answers is raised as the
class its `ErrorBody.kind` names in errors.TABLE, so it exits as if the CLI had found it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from supervisor.core import protocol
from supervisor.core.config import Paths, load_settings
from supervisor.core.errors import DaemonError, DaemonNotRunning, RequestRejected, error_of
from supervisor.core.overrides import FieldOverrides
from supervisor.store import migration_notice

M = TypeVar("M", bound=BaseModel)

_START_TIMEOUT_S = 20.0


class Client:
    def __init__(self, paths: Paths, *, timeout_s: float = 120.0) -> None:
        self.paths = paths
        transport = httpx.HTTPTransport(uds=str(paths.socket))
        self._http = httpx.Client(transport=transport, base_url="http://supervise", timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    # -- daemon lifecycle --------------------------------------------------------------

    def ping(self) -> protocol.PingResponse:
        return self._call("GET", "/v1/ping", protocol.PingResponse)

    def accepting(self) -> bool:
        """Whether something accepts connections on the socket.  A plain socket, closed on every
        path: the HTTP client's own failed connects leave their socket to the garbage collector."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(str(self.paths.socket))
            except OSError:
                return False
        return True

    def ensure_daemon(self) -> protocol.PingResponse:
        if self.accepting():
            return self.ping()
        spawn_daemon(self.paths)
        deadline = time.monotonic() + _START_TIMEOUT_S
        said = False
        while True:
            if self.accepting():
                return self.ping()
            migrating = migration_notice.current(self.paths.db)
            if migrating is not None:
                # Busy, not stuck: waited for as long as it lives, and said once.
                if not said:
                    print(f"supervise: {migrating.describe()}; waiting for it (see {self.paths.daemon_log})",
                          file=sys.stderr, flush=True)
                    said = True
                deadline = time.monotonic() + _START_TIMEOUT_S
            elif time.monotonic() >= deadline:
                raise DaemonError(f"the daemon did not start within {_START_TIMEOUT_S:.0f}s; see {self.paths.daemon_log}")
            time.sleep(0.05)

    # -- requests ----------------------------------------------------------------------

    def start(self, spec_path: str, overrides: dict[str, str], after: list[str] | None = None,
              fields: FieldOverrides | None = None) -> protocol.StartResponse:
        body = protocol.StartRequest(spec_path=spec_path, overrides=overrides, after=after or [],
                                     fields=fields or FieldOverrides())
        return self._call("POST", "/v1/jobs", protocol.StartResponse, body)

    def start_pipeline(self, spec_path: str, overrides: dict[str, str],
                       fields: FieldOverrides | None = None) -> protocol.PipelineStartResponse:
        body = protocol.PipelineStartRequest(spec_path=spec_path, overrides=overrides, fields=fields or FieldOverrides())
        return self._call("POST", "/v1/pipelines", protocol.PipelineStartResponse, body)

    def stop(self, job: str, grace_s: float | None) -> protocol.StopResponse:
        return self._call("POST", f"/v1/jobs/{job}/stop", protocol.StopResponse, protocol.StopRequest(grace_s=grace_s))

    def status(self, job: str | None = None) -> protocol.StatusResponse:
        return self._call("GET", "/v1/status", protocol.StatusResponse, params={"job": job} if job else None)

    def attempts(self, job: str) -> protocol.AttemptsResponse:
        return self._call("GET", f"/v1/jobs/{job}/attempts", protocol.AttemptsResponse)

    def events(self, job: str, attempt: int | None = None, kinds: list[str] | None = None,
               after: int | None = None) -> protocol.EventsResponse:
        """Stored events in id order, at most 10,000 a call: pass the last id as `after` for more."""
        return self._call("GET", f"/v1/jobs/{job}/events", protocol.EventsResponse,
                          params=_params(attempt=attempt, kinds=",".join(kinds or []) or None, after=after))

    def all_events(self, job: str, attempt: int | None = None, kinds: list[str] | None = None,
                   page: int | None = None) -> Iterator[protocol.EventInfo]:
        """Every stored event in id order, however many: one page after another."""
        after = None
        while True:
            events = self._call("GET", f"/v1/jobs/{job}/events", protocol.EventsResponse,
                                params=_params(attempt=attempt, kinds=",".join(kinds or []) or None, after=after,
                                               limit=page)).events
            yield from events
            if not events:
                return
            after = events[-1].id

    def gpus(self) -> protocol.GpusResponse:
        return self._call("GET", "/v1/gpus", protocol.GpusResponse)

    def job_gpu(self, job: str) -> protocol.JobGpuResponse:
        return self._call("GET", f"/v1/jobs/{job}/gpu", protocol.JobGpuResponse)

    def config(self) -> protocol.ConfigResponse:
        return self._call("GET", "/v1/config", protocol.ConfigResponse)

    def web(self, request: protocol.WebRequest) -> protocol.WebResponse:
        return self._call("POST", "/v1/web", protocol.WebResponse, request)

    def follow_events(self, job: str, *, attempt: int | None = None, min_attempt: int | None = None, after: int = 0,
                      until_done: bool = False, kinds: list[str] | None = None) -> Iterator[protocol.EventInfo]:
        params = _params(follow="1", attempt=attempt, min_attempt=min_attempt, after=after,
                         until_done="1" if until_done else None,
                         kinds=",".join(kinds or []) or None)
        yield from self._stream(f"/v1/jobs/{job}/events", params, protocol.EventInfo)

    def follow_log(self, job: str, *, attempt: int | None, follow: bool, offset: int = 0,
                   timestamps: bool = False) -> Iterator[protocol.LogChunk]:
        params = _params(attempt=attempt, follow="1" if follow else None, offset=offset or None,
                         timestamps="1" if timestamps else None)
        yield from self._stream(f"/v1/jobs/{job}/log", params, protocol.LogChunk)

    def restart(self, job: str, grace_s: float | None, fields: FieldOverrides | None = None, *,
                reload: bool = False) -> protocol.RestartResponse:
        return self._call("POST", f"/v1/jobs/{job}/restart", protocol.RestartResponse,
                          protocol.RestartRequest(grace_s=grace_s, fields=fields or FieldOverrides(), reload=reload))

    def remove(self, job: str, *, logs: bool) -> protocol.RemoveResponse:
        return self._call("DELETE", f"/v1/jobs/{job}", protocol.RemoveResponse, params=_params(logs="1" if logs else None))

    def prune(self, job: str | None = None) -> protocol.PruneResponse:
        return self._call("POST", "/v1/prune", protocol.PruneResponse, params=_params(job=job))

    def stacks(self, job: str) -> protocol.StacksResponse:
        return self._call("GET", f"/v1/jobs/{job}/stacks", protocol.StacksResponse)

    def quarantine(self) -> protocol.QuarantineResponse:
        return self._call("GET", "/v1/quarantine", protocol.QuarantineResponse)

    def clear_quarantine(self, place: str) -> protocol.QuarantineResponse:
        return self._call("POST", "/v1/quarantine/clear", protocol.QuarantineResponse,
                          protocol.QuarantineClearRequest(place=place))

    def hold(self, job: str) -> protocol.HoldResponse:
        return self._call("POST", f"/v1/jobs/{job}/hold", protocol.HoldResponse)

    def release(self, job: str) -> protocol.HoldResponse:
        return self._call("POST", f"/v1/jobs/{job}/release", protocol.HoldResponse)

    def stop_daemon(self) -> protocol.DaemonStopResponse:
        return self._call("POST", "/v1/daemon/stop", protocol.DaemonStopResponse)

    # -- plumbing ----------------------------------------------------------------------

    def _call(self, method: str, path: str, model: type[M], body: BaseModel | None = None,
              params: dict[str, Any] | None = None) -> M:
        try:
            response = self._http.request(method, path, params=params,
                                          content=body.model_dump_json() if body else None)
        except (httpx.ConnectError, FileNotFoundError) as exc:
            raise DaemonNotRunning(f"no daemon is listening on {self.paths.socket}") from exc
        except httpx.TransportError as exc:
            raise DaemonError(f"lost the daemon's connection: {exc}") from exc
        _raise_for_error(response)
        return model.model_validate_json(response.content)

    def _stream(self, path: str, params: dict[str, Any], model: type[M]) -> Iterator[M]:
        try:
            with self._http.stream("GET", path, params=params, timeout=httpx.Timeout(10.0, read=None)) as response:
                if response.status_code >= 400:
                    response.read()
                    _raise_for_error(response)
                for line in response.iter_lines():
                    if line:
                        yield model.model_validate_json(line)
        except (httpx.ConnectError, FileNotFoundError) as exc:
            raise DaemonNotRunning(f"no daemon is listening on {self.paths.socket}") from exc
        except httpx.TransportError as exc:
            raise DaemonError(f"lost the daemon's connection: {exc}") from exc


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _raise_for_error(response: httpx.Response) -> None:
    """Raise the error the daemon named: the class errors.TABLE pairs with the body's kind."""
    if response.status_code < 400:
        return
    try:
        body = protocol.ErrorBody.model_validate_json(response.content)
    except ValueError:  # not the daemon's ErrorBody (aiohttp's own 404/405 for an unknown route)
        raise RequestRejected(response.text[:300] or f"HTTP {response.status_code}", response.status_code) from None
    raise error_of(body.kind, body.error, response.status_code)


def spawn_daemon(paths: Paths) -> None:
    """Start the daemon detached: its own session, output to its log file."""
    load_settings(paths)  # a malformed config is reported here, in one line, not in the daemon's log
    paths.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    # 0600: the daemon's log names jobs and their failures; only this user may read it.
    with open(os.open(paths.daemon_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600), "ab") as log_file:
        # Through a shell that exits at once, so the daemon is nobody's child here: it outlives this CLI.
        subprocess.run(
            ["/bin/sh", "-c", '"$@" &', "sh", sys.executable, "-m", "supervisor.daemon.process"],
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, start_new_session=True,
            env={**os.environ, "SUPERVISE_HOME": str(paths.state_dir)}, close_fds=True, check=False,
        )
