"""What listings carry of a job's long text (README "Limits").

A listing (`GET /v1/jobs`, `rc jobs`), `GET /v1/state` (`rc ps`, the
dashboard), a device's recent jobs and the activity feed carry a command,
a reason or an event's text cut to LISTED_TEXT_CHARS characters, the last
one CUT_MARK when something was cut, so a reader sees it is not all;
`GET /v1/jobs/ID` (`rc show`) carries the job whole. The store cuts in
SQL where it reads the rows (a bounded prefix of each text: see
COMMAND_HEAD_CHARS), so a listing never loads a whole command.

    >>> cut("x" * 300)[-3:], len(cut("x" * 300))
    ('xx…', 256)
    >>> cut_argv(("echo", "y" * 300))[1][-2:], listed_chars(cut_argv(("echo", "y" * 300)))
    ('y…', 256)
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

__all__ = [
    "COMMAND_HEAD_CHARS",
    "CUT_MARK",
    "LISTED_TEXT_CHARS",
    "TEXT_HEAD_CHARS",
    "argv_head",
    "cut",
    "cut_argv",
    "listed_chars",
]

LISTED_TEXT_CHARS = 256
"""The most characters of a command (its arguments joined by spaces), a
reason or an event's text that a listing carries."""

CUT_MARK = "…"
"""The last character of a text that was cut (it counts in the limit)."""

TEXT_HEAD_CHARS = LISTED_TEXT_CHARS + 1
"""The characters of a reason or an event's text the store reads for a
listing: one past the limit says it was longer (queries.sql reads
substr(text, 1, 257); tests/unit/test_listed.py holds the SQL to it)."""

COMMAND_HEAD_CHARS = 8 * LISTED_TEXT_CHARS
"""The characters of a command's stored JSON text (an array of strings)
the store reads for a listing (queries.sql reads substr(command, 1, 2048)):
enough for LISTED_TEXT_CHARS of any command, an escaped character being at
most 6 characters of JSON and an argument's quotes and comma 3 for the one
space it counts."""

_PARTIAL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*(\\u[0-9a-fA-F]{0,3}|\\)\Z")


def cut(text: str, limit: int = LISTED_TEXT_CHARS) -> str:
    """`text` as it is when it has at most `limit` characters, else its
    first `limit - 1` and CUT_MARK (`limit` characters in all). `limit` >= 1."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + CUT_MARK


def listed_chars(argv: Sequence[str]) -> int:
    """The characters a command counts for the limit: its arguments' and one
    space between each two (0 for an empty command)."""
    return sum(len(a) for a in argv) + max(0, len(argv) - 1)


def cut_argv(
    argv: Sequence[str], whole: bool = True, limit: int = LISTED_TEXT_CHARS
) -> tuple[str, ...]:
    """A command as a listing carries it: `argv` as it is when it is `whole`
    (False: it is the start of a longer command, as argv_head reads it) and
    counts at most `limit` characters (listed_chars); else the arguments
    that fit, the last one cut to end in CUT_MARK, so that the result counts
    at most `limit` characters. `limit` >= 1."""
    if whole and listed_chars(argv) <= limit:
        return tuple(argv)
    out: list[str] = []
    room = limit - 1  # the mark's own character
    for a in argv:
        if len(a) >= room:
            out.append(a[:room] + CUT_MARK)
            return tuple(out)
        out.append(a)
        room -= len(a) + 1  # the space before the next one (room stays >= 0)
    if not out:
        return (CUT_MARK,)
    out[-1] += CUT_MARK
    return tuple(out)


def argv_head(head: str) -> tuple[tuple[str, ...], bool]:
    """The arguments of a command from the start of its stored JSON text
    (an array of strings): (arguments, whole). `whole` is False when `head`
    stops before the array ends; the last argument is then as much of it as
    `head` holds (an escape or a surrogate pair cut in half is left out).

    Raises ValueError when `head` is not the start of a JSON array of strings.
    """
    n = len(head)
    i = _space(head, 0)
    if i >= n or head[i] != "[":
        raise ValueError("a command's JSON text starts with '['")
    args: list[str] = []
    i = _space(head, i + 1)
    if i < n and head[i] == "]":
        return (), True
    while i < n:
        if head[i] != '"':
            raise ValueError(f"a command's JSON text holds only strings (at {i})")
        try:
            arg, i = json.decoder.scanstring(head, i + 1)
        except json.JSONDecodeError:
            args.append(_partial(head[i + 1 :]))
            return tuple(args), False
        args.append(arg)
        i = _space(head, i)
        if i >= n:
            break
        if head[i] == "]":
            return tuple(args), True
        if head[i] != ",":
            raise ValueError(f"a command's JSON text separates its strings with ',' (at {i})")
        i = _space(head, i + 1)
    return tuple(args), False


def _space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def _partial(body: str) -> str:
    """The start of a JSON string's contents (no closing quote) decoded,
    without an escape it cuts in half or a lone high surrogate at its end."""
    m = _PARTIAL_ESCAPE.search(body)
    if m is not None:
        body = body[: m.start(1)]
    text, _ = json.decoder.scanstring(body + '"', 0)
    if text and "\ud800" <= text[-1] <= "\udbff":
        text = text[:-1]
    return text
