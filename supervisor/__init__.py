"""supervise: a supervisor for long-running GPU jobs."""

__version__ = "0.1.0"
# Checked by the console script: another distribution (supervisord) installs a package of the same name.
__distribution__ = "supervise"
