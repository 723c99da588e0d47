"""Bounds that a request and the command line check alike, kept apart from the API's models so that
the command line can check its flags without loading them."""

from __future__ import annotations

# Every number a request carries is finite and bounded: a grace of 1e12 s (or inf) once made
# `stop` wait forever.  A day is far past any real shutdown.
MAX_GRACE_S = 86400.0
