"""supervise: a supervisor for long-running GPU jobs."""

__version__ = "0.1.0"
