"""How a tab learns that the server on the page's address is the daemon, before it sends a thing.

A tab holds the token, but whatever answers on the page's port is not necessarily the daemon:
with the daemon down, any program may take the port, and a tab that sent its token (a
reconnecting event stream, a periodic fetch) would hand it over.  So a tab sends nothing but a
random nonce until the server has proved it knows the token:

    GET /api/hello?nonce=N  ->  {"instance": I, "proof": HMAC(token, "hello:" + N + ":" + I)}

I is made afresh each time the page's server starts.  The tab checks the proof, then sends, as
its bearer, not the token but `HMAC(token, "session:" + I)`: what a later impostor on the port
could catch is a credential of a server that no longer listens, worth nothing to the next one.
The token itself (what `supervise web` printed) stays accepted, for scripts and curl.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from pydantic import BaseModel

_NONCE = re.compile(r"[0-9a-f]{32,128}")


class Hello(BaseModel):
    instance: str
    proof: str


def mac(token: str, message: str) -> str:
    return hmac.new(token.encode(), message.encode(), hashlib.sha256).hexdigest()


class Handshake:
    """One server's side: its instance, its proofs, and the bearers it takes."""

    def __init__(self, token: str) -> None:
        self._token = token
        self.instance = secrets.token_hex(16)
        self._session = mac(token, f"session:{self.instance}")

    @staticmethod
    def valid_nonce(nonce: str) -> bool:
        return _NONCE.fullmatch(nonce) is not None

    def hello(self, nonce: str) -> Hello:
        return Hello(instance=self.instance, proof=mac(self._token, f"hello:{nonce}:{self.instance}"))

    def accepts(self, bearer: str | None) -> bool:
        if bearer is None:
            return False
        given = bearer.encode()
        # Both compared whatever the first gives: how long a refusal takes says nothing of which.
        session = secrets.compare_digest(given, self._session.encode())
        token = secrets.compare_digest(given, self._token.encode())
        return session or token
