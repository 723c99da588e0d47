"""reference/metrics.md: every metric the daemon exports, read from a Metrics registry built with an
empty source (supervisor/daemon/metrics.py): its name, type, labels and help text."""

from __future__ import annotations

from typing import Any

from .source import cell, doc


class _NoDaemon:
    """A metrics source with no jobs and no hosts: the registry still declares every family."""

    def job_readings(self) -> list[Any]:
        return []

    def host_readings(self) -> list[Any]:
        return []

    def shard_of(self, job: str, attempt: int) -> int | None:
        return None

    def alert_counts(self) -> Any:
        from supervisor.notify.alerts import AlertCounts

        return AlertCounts(queued=0, suppressed=0, dropped=0, failed=0)


def families() -> list[tuple[str, str, str, str]]:
    """(exposed name, type, labels, help) for each family, in the order the daemon exports them."""
    from prometheus_client.metrics import MetricWrapperBase

    from supervisor.daemon.metrics import Metrics

    metrics = Metrics(_NoDaemon())  # type: ignore[arg-type]
    labels: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics).values():  # the counters and the histogram keep their label names
        if isinstance(value, MetricWrapperBase):
            labels[value._name] = tuple(value._labelnames)
    out = []
    for family in metrics.registry.collect():
        names = labels.get(family.name) or tuple(getattr(family, "_labelnames", ()))
        if family.type == "info":
            names = ("version",)
        exposed = {"counter": f"{family.name}_total", "info": f"{family.name}_info"}.get(family.type, family.name)
        if family.name.endswith("_total"):  # a counter family built by hand keeps its name
            exposed = family.name
        out.append((exposed, family.type, ", ".join(f"`{n}`" for n in names), family.documentation))
    return out


def render() -> str:
    import supervisor.daemon.metrics as module

    out = ["# Metrics", "",
           "Generated from `supervisor/daemon/metrics.py` by `python docs/gen_reference.py`; do not edit by hand. How to",
           "scrape them and the alerting rules: [the metrics guide](../guides/metrics.md).", "",
           doc(module).split("\n\nTwo sources:")[0], "",
           "| metric | type | labels | what |", "|---|---|---|---|"]
    out += [f"| `{name}` | {kind} | {labels} | {cell(text)} |" for name, kind, labels, text in families()]
    return "\n".join(out).rstrip() + "\n"
