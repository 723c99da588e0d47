"""The one host name that means this machine, as specs, stored attempts and the API write it.

A spec's ``host`` (and a stored attempt's) is a URL — ``ssh://…``, ``slurm://…`` — or this name.
What differs between kinds of host at run time is each host's capabilities (``hosts.base``); this
is only the spelling, so that no module compares against a string literal of its own.
"""

from __future__ import annotations

LOCAL_HOST = "local"


def is_local(host: str) -> bool:
    """Whether a spec's or a stored attempt's host names this machine."""
    return host == LOCAL_HOST
