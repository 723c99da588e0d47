"""The signal a job asks for before any kill (`kill_signal_first`): a name from Python's signal
module, checked when the spec is read, and the grace that follows it."""

from __future__ import annotations

import signal

from supervisor.core.errors import shown

# How long the program has to save its checkpoint when the spec sets a signal but no grace.
DEFAULT_CHECKPOINT_GRACE_S = 60.0

# Signals a program cannot catch, or that would end or freeze it before any checkpoint: sending
# one "first" would be the kill itself (or a pause the TERM then cannot reach).
_REFUSED = frozenset({"SIGKILL", "SIGSTOP", "SIGTERM", "SIGCONT", "SIGTSTP", "SIGTTIN", "SIGTTOU"})


def first_signal_name(value: str) -> str:
    """The canonical name (``SIGUSR1``) of a signal a spec gives as ``SIGUSR1`` or ``USR1``."""
    name = value.strip().upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    known = {s.name for s in signal.Signals if not s.name.startswith("SIG_")}
    if name not in known:
        raise ValueError(f"{shown(value)} is not a signal name (e.g. \"SIGUSR1\")")
    if name in _REFUSED:
        raise ValueError(f"{name} cannot ask for a checkpoint (it is caught by no program, or is the kill "
                         "itself): use e.g. \"SIGUSR1\"")
    return name


def first_signal(name: str) -> signal.Signals:
    """The signal a validated name stands for."""
    return signal.Signals[name]
