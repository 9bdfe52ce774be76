"""Durations as people type them: "90s", "5m", "2h", "1h30m", "1d", "250ms".

A bare number is seconds; digits are ASCII 0-9. Units: ms, s, m, h, d, w,
each at most once and largest first ("1h30m", never "30m1h" or "5m5m"). Parsing returns float
seconds; formatting gives the shortest exact form ("1h30m", "45s").
"""

from __future__ import annotations

import re

from rc.proto.errors import RcError

__all__ = ["DurationError", "format_duration", "parse_duration", "whole_seconds"]

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
# ASCII digits only: \d would take other scripts' digits ("１０" as 10)
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d|w)")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
MAX_SECONDS = 100 * 365 * 86400.0


class DurationError(RcError, ValueError):
    """A duration string could not be read; the message quotes it and shows the form."""


def parse_duration(text: str) -> float:
    """Return the seconds `text` stands for.

    Raises DurationError for an empty, negative, malformed or absurdly long
    (over 100 years) duration.
    """
    s = text.strip().lower()
    if not s:
        raise DurationError("empty duration (use a form like 90s, 5m, 1h30m)")
    if _NUMBER.fullmatch(s):
        seconds = float(s)
    else:
        pos = 0
        seconds = 0.0
        last = float("inf")
        for m in _PART.finditer(s):
            size = _UNITS[m.group(2)]
            if m.start() != pos or size >= last:  # each unit once, largest first
                pos = -1
                break
            seconds += float(m.group(1)) * size
            last = size
            pos = m.end()
        if pos != len(s) or pos == 0:
            raise DurationError(f"bad duration {text!r} (use a form like 90s, 5m, 2h, 1h30m, 1d)")
    if seconds > MAX_SECONDS:
        raise DurationError(f"duration {text!r} is longer than 100 years")
    return seconds


def whole_seconds(text: str, what: str = "duration") -> int:
    """Parse a duration that must be a whole number of seconds (the wire's unit).

    Raises DurationError when it has a fractional second, e.g. "1500ms".
    """
    seconds = parse_duration(text)
    if seconds != int(seconds):
        raise DurationError(f"{what} {text!r} must be a whole number of seconds")
    return int(seconds)


def format_duration(seconds: float) -> str:
    """Render seconds compactly: 0 → "0s", 90 → "1m30s", 93784 → "1d2h3m4s"."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    total = round(seconds)
    if total == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        n, total = divmod(total, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)
