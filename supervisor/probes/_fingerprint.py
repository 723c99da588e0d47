"""Failure fingerprints: the same bug gives the same short hex string on every rerun.

A fingerprint hashes the exception type, the message with everything run-specific
replaced (numbers, hex addresses, paths, pids, timestamps, sizes, uuids), and the
innermost frame as ``file.py:function`` (no directory, no line number).  Two attempts
failing with the same fingerprint in a row are a deterministic bug: the policy stops
relaunching.
"""

from __future__ import annotations

import hashlib
import re

# Order matters: wider patterns first, so a timestamp is not eaten as three numbers.
_NORMALIZERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), "<uuid>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[ T_]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"), "<ts>"),
    (re.compile(r"\b\d{2}[-/]\d{2}(?:[-/]\d{2,4})? \d{2}:\d{2}:\d{2}(?:[.,]\d+)?"), "<ts>"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<ts>"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"(?:[A-Za-z]:)?(?:~|\.{1,2})?(?:/[\w.@+~-]+){2,}/?"), "<path>"),
    (re.compile(r"\b(?:pid|PID|Pid)(?:\s*[=:]\s*|\s+)\d+"), "pid=<n>"),
    (re.compile(r"\b\d+(?:\.\d+)?\s?(?:[KMGTP]i?B|bytes|B)\b"), "<size>"),
    (re.compile(r"\b[0-9a-f]{12,}\b"), "<hex>"),
    (re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"), "<n>"),
)
_SPACES = re.compile(r"\s+")
_FRAME = re.compile(r'File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)')


_MAX_MESSAGE_CHARS = 2000  # enough to tell bugs apart; bounds the work on huge lines


# What each normalizer cannot match without (None: no cheap test).  Replacing only ever
# removes these, so a need absent from the message is absent at every step: the pattern is
# skipped (most failure messages have no uuid, time, address or path).
_DIGIT = "0"  # stands for "a digit", tested once with _HAS_DIGIT
_HAS_DIGIT = re.compile(r"\d")
_NEEDS: tuple[str | None, ...] = ("-", ":", ":", ":", "0x", "/", _DIGIT, _DIGIT, None, _DIGIT)
assert len(_NEEDS) == len(_NORMALIZERS)


def normalize_message(message: str) -> str:
    """``message`` with run-specific details replaced by placeholders."""
    text = message[:_MAX_MESSAGE_CHARS]
    digit = _HAS_DIGIT.search(text) is not None
    for (pattern, placeholder), need in zip(_NORMALIZERS, _NEEDS, strict=True):
        if need is None or (digit if need is _DIGIT else need in text):
            text = pattern.sub(placeholder, text)
    return _SPACES.sub(" ", text).strip()


def frame_id(frame: str | None) -> str:
    """``file.py:function`` from a traceback frame line (or such an id already), else ''."""
    if not frame:
        return ""
    match = _FRAME.search(frame)
    if match is None:
        return frame.strip()
    base = match.group("path").replace("\\", "/").rsplit("/", 1)[-1]
    return f"{base}:{match.group('func')}"


def fingerprint(exc_type: str, message: str, innermost_frame: str | None = None) -> str:
    """A short, stable hex id of a failure.

    ``exc_type`` is reduced to its last dotted component (``torch.cuda.OutOfMemoryError``
    and ``torch.OutOfMemoryError`` are one bug across torch versions); ``innermost_frame``
    is a traceback ``File "...", line N, in f`` line or an id such as ``adam.py:step``.
    """
    kind = exc_type.strip().rsplit(".", 1)[-1].rsplit("::", 1)[-1]
    key = "\x00".join((kind, normalize_message(message), frame_id(innermost_frame)))
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:16]
