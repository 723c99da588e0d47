"""asyncssh, imported once for every module that speaks SSH, without the one warning its import raises.

cryptography 51 deprecated DSA, and asyncssh's import names the DSA key classes to offer that key type, so every
import prints five `CryptographyDeprecationWarning: DSA is deprecated` lines: at the top of each daemon.log, on
`supervise doctor --host`, and as errors in a suite that turns warnings into errors.  That one warning, raised
from asyncssh's own modules at import, is silenced here and nowhere else: the same warning from another module, or
any other deprecation, still shows.  Modules import asyncssh from here, never directly, so the filter cannot be
bypassed by whichever happens to import it first.
"""

from __future__ import annotations

import warnings

from cryptography.utils import CryptographyDeprecationWarning

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"DSA is deprecated", category=CryptographyDeprecationWarning,
                            module=r"asyncssh(\.|$)")
    import asyncssh

__all__ = ["asyncssh"]
