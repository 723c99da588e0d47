"""What the API needs of the running daemon: `Service` (service.Service provides it), so the
API depends on this shape and not on the lifecycle module that serves it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import structlog

from supervisor.core import protocol
from supervisor.store.database import Store

if TYPE_CHECKING:
    from supervisor.core.bus import EventBus
    from supervisor.core.config import DaemonSettings, LoadedSettings, Paths
    from supervisor.daemon.metrics import Metrics
    from supervisor.hosts.registry import Hosts
    from supervisor.jobs.owner import Supervisor
    from supervisor.jobs.quarantine import Quarantines
    from supervisor.jobs.snapshot import RunnerSnapshot

log = structlog.get_logger("supervise.api")

class WebControl(Protocol):
    """The web page's switch (web.WebUi provides it)."""

    async def configure(self, request: protocol.WebRequest) -> protocol.WebResponse: ...

    @property
    def problem(self) -> str | None:
        """Why the page asked for is not served; None when it is, or none was asked for."""


class Service(Protocol):
    """What the handlers need of the running daemon (service.Service provides it): the API
    depends on this shape, not on the lifecycle module that serves it.  Read-only
    properties, so that the service may hold more specific types."""

    @property
    def paths(self) -> Paths: ...

    @property
    def settings(self) -> DaemonSettings: ...

    @property
    def loaded(self) -> LoadedSettings: ...

    @property
    def store(self) -> Store: ...

    @property
    def bus(self) -> EventBus: ...

    @property
    def hosts(self) -> Hosts: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def jobs(self) -> Supervisor: ...

    @property
    def web(self) -> WebControl: ...

    @property
    def quarantines(self) -> Quarantines: ...

    def snapshot(self, job: str) -> RunnerSnapshot | None: ...

    def request_stop(self) -> None: ...
