"""Rendering for humans and machines: tables, JSON, ages, durations."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

from rc.proto.codec import encode
from rc.proto.duration import format_duration

__all__ = [
    "EscapingStream",
    "add_output_flag",
    "age",
    "command_text",
    "duration",
    "escape_controls",
    "one_line",
    "print_json",
    "print_line",
    "table",
    "when",
]

_KEPT = "\n\t\r"


def escape_controls(text: str) -> str:
    """`text` with every control character but newline, tab and carriage
    return shown as an escape (ESC → \\x1b): what other users wrote (a hold
    reason, a command, a label) can never drive the terminal reading it."""
    if (
        text.isprintable()
        or text.replace("\n", "").replace("\t", "").replace("\r", "").isprintable()
    ):
        return text  # the common case, at C speed (a whole table is one write)
    return "".join(c if c.isprintable() or c in _KEPT else repr(c)[1:-1] for c in text)


def one_line(text: str) -> str:
    """`text` with newlines, carriage returns and tabs shown as escapes: for
    a line that carries what someone else wrote (a hold reason, a fault
    detail, an event), so it can never forge a line of its own."""
    if "\n" not in text and "\r" not in text and "\t" not in text:
        return text
    return text.replace("\t", "\\t").replace("\r", "\\r").replace("\n", "\\n")


def print_line(text: str) -> None:
    """print(one_line(text))."""
    print(one_line(text))


class EscapingStream:
    """A text stream that passes everything through escape_controls. Bytes
    written to `.buffer` (a job's own output) go through untouched."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(escape_controls(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def add_output_flag(p) -> None:
    """The `-o text|json` option every listing takes."""
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="output format (json prints the records on stdout)",
    )


def print_json(obj: Any) -> None:
    """Records as indented JSON on stdout."""
    json.dump(encode(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A left-aligned table on stdout; None and "" render as "-"."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
        for row in (list(headers), *cells)
    ]
    sys.stdout.write("\n".join(lines) + "\n")


def _cell(v: Any) -> str:
    if v is None or v == "":
        return "-"
    text = str(v)
    return text.replace("\n", "\\n").replace("\t", " ")


def duration(seconds: float | None) -> str:
    """Seconds as "1h2m3s" (None → "-")."""
    if seconds is None:
        return "-"
    return format_duration(round(max(0.0, seconds)))


def age(seconds: float | None) -> str:
    """An age on the inventory's ladder: 45s / 12m / 3h / 5d / 2mo ago.

    A negative age (a timestamp from the future) says so; None says the
    controller did not send one.
    """
    if seconds is None:
        return "age unknown (controller may be out of date)"
    if seconds < 0:
        return f"{_ladder(-seconds)} in the future (clock skew?)"
    return f"{_ladder(seconds)} ago"


def _ladder(s: float) -> str:
    if s < 60:
        return f"{int(s)}s"
    if s < 3600:
        return f"{int(s // 60)}m"
    if s < 86400:
        return f"{int(s // 3600)}h"
    if s < 30 * 86400:
        return f"{int(s // 86400)}d"
    return f"{int(s // (30 * 86400))}mo"


def when(ts: float | None) -> str:
    """A timestamp as UTC RFC 3339 to the second ("-" for None)."""
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def command_text(argv: Sequence[str], limit: int = 60) -> str:
    """A command line shortened for a table column."""
    import shlex

    text = " ".join(shlex.quote(a) for a in argv).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 1] + "…"
