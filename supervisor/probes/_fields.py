"""Probe field conversion: the text a named group captured, as the type its probe declares
(`int`, `float`, `str`, `bool`, `duration`, `rate`), in the forms tools print them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Converter = Callable[[str], Any]


def _to_int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return int(value.replace(",", "").replace("_", ""))


def _to_float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        return float(value.replace(",", ""))


def _to_bool(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on", "y")


def _to_duration(value: str) -> float | None:
    """tqdm's ``MM:SS`` / ``H:MM:SS`` / ``D:HH:MM:SS``, or ``12.5s``, in seconds."""
    if len(value) == 5 and value[2] == ":":  # the usual MM:SS, quickly
        return int(value[:2]) * 60 + int(value[3:]) + 0.0
    text = value.strip().rstrip("s")
    if not text or "?" in text:
        return None
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + float(part)
    return total


def _to_rate(value: str) -> float | None:
    """tqdm's ``3.95it/s`` or ``1.16s/it`` (any unit) as items per second."""
    text = value.strip()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ/ ")
    amount = float(number)
    if text[len(number) :].lstrip().startswith("s/"):
        return 1.0 / amount if amount else None
    return amount


CONVERTERS: dict[str, Converter] = {
    "int": _to_int,
    "float": _to_float,
    "str": str,
    "bool": _to_bool,
    "duration": _to_duration,
    "rate": _to_rate,
}
