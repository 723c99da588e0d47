"""The route table: method, path, handler name, request and response models.  The handlers
(``_handlers``) and the OpenAPI document (``_openapi``) are both made from it."""

from __future__ import annotations

from pydantic import BaseModel

from supervisor.core import protocol

ROUTES: list[tuple[str, str, str, type[BaseModel] | None, type[BaseModel] | None]] = [
    ("GET", "/v1/ping", "ping", None, protocol.PingResponse),
    ("POST", "/v1/jobs", "start_job", protocol.StartRequest, protocol.StartResponse),
    ("GET", "/v1/jobs", "jobs", None, protocol.JobsResponse),
    ("GET", "/v1/job-names", "job_names", None, protocol.JobNamesResponse),
    ("POST", "/v1/jobs/{name}/stop", "stop_job", protocol.StopRequest, protocol.StopResponse),
    ("GET", "/v1/status", "status", None, protocol.StatusResponse),
    ("GET", "/v1/jobs/{name}/attempts", "attempts", None, protocol.AttemptsResponse),
    ("GET", "/v1/jobs/{name}/events", "events", None, protocol.EventsResponse),
    ("GET", "/v1/jobs/{name}/log", "logs", None, protocol.LogChunk),
    ("GET", "/v1/gpus", "gpus", None, protocol.GpusResponse),
    ("GET", "/v1/jobs/{name}/gpu", "job_gpu", None, protocol.JobGpuResponse),
    ("GET", "/v1/config", "config", None, protocol.ConfigResponse),
    ("POST", "/v1/web", "web_page", protocol.WebRequest, protocol.WebResponse),
    ("POST", "/v1/jobs/{name}/restart", "restart_job", protocol.RestartRequest, protocol.RestartResponse),
    ("DELETE", "/v1/jobs/{name}", "remove_job", None, protocol.RemoveResponse),
    ("POST", "/v1/prune", "prune", None, protocol.PruneResponse),
    ("POST", "/v1/daemon/stop", "stop_daemon", None, protocol.DaemonStopResponse),
    ("POST", "/v1/jobs/{name}/hold", "hold_job", None, protocol.HoldResponse),
    ("POST", "/v1/jobs/{name}/release", "release_job", None, protocol.HoldResponse),
    ("GET", "/v1/jobs/{name}/stacks", "job_stacks", None, protocol.StacksResponse),
    ("POST", "/v1/pipelines", "start_pipeline", protocol.PipelineStartRequest, protocol.PipelineStartResponse),
    ("GET", "/v1/quarantine", "quarantine", None, protocol.QuarantineResponse),
    ("POST", "/v1/quarantine/clear", "clear_quarantine", protocol.QuarantineClearRequest, protocol.QuarantineResponse),
]
