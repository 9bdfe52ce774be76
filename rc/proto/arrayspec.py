"""Job array specs: which indices an array has, and how many may run at once.

Grammar (`rc run --array SPEC`, SubmitRequest.array):

    SPEC  := LIST ["%" K] | "%" K           ("%" K alone: with array_items)
    LIST  := TERM ("," TERM)*
    TERM  := N | N "-" M [":" S]            (N <= M; S >= 1: N, N+S, ... <= M)

N, M, S and K are ASCII digits. Indices are 0..INDEX_MAX, sorted, each
once; the terms together name at most ARRAY_MAX (an index two terms share
counts twice towards that bound). K, at least 1, caps how many elements run at once (none
without it). `parse` raises ArraySpecError naming the bad term; `format`
writes the normal form, which parses back to the same indices and cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ARRAY_MAX", "INDEX_MAX", "ArraySpec", "ArraySpecError", "format", "parse"]

ARRAY_MAX = 10_000
"""The most elements one array may have."""
INDEX_MAX = 1_000_000
"""The highest index an array may use."""

_DIGITS_MAX = len(str(INDEX_MAX))
"""No number of a spec needs more digits (longer ones are refused before int())."""
_TERM = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")
_DIGITS = re.compile(r"[0-9]+")


class ArraySpecError(ValueError):
    """A malformed or out-of-bounds array spec; the message names the problem."""


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """Parsed SPEC: the indices, ascending and distinct (() for "%K"
    alone), and the cap on running elements (0: none)."""

    indices: tuple[int, ...]
    max_running: int = 0


def _number(text: str, what: str, spec: str) -> int:
    if not _DIGITS.fullmatch(text) or len(text) > _DIGITS_MAX:
        raise ArraySpecError(f"array spec {spec!r}: {what} {text!r} is not a number (digits 0-9)")
    return int(text)


def parse(spec: str) -> ArraySpec:
    """Parse SPEC (see the module's grammar). Raises ArraySpecError."""
    text = spec.strip()
    if not text:
        raise ArraySpecError("the array spec is empty (e.g. 0-99, 1,5,9 or 0-99%8)")
    body, pct, cap_text = text.partition("%")
    cap = 0
    if pct:
        cap = _number(cap_text, "the cap after %", spec)
        if not 1 <= cap <= ARRAY_MAX:
            raise ArraySpecError(
                f"array spec {spec!r}: %{cap} must be from %1 to %{ARRAY_MAX} "
                "(how many elements may run at once)"
            )
    if not body:
        if not pct:
            raise ArraySpecError("the array spec is empty")
        return ArraySpec((), cap)
    ranges: list[range] = []
    total = 0
    for term in body.split(","):
        m = _TERM.fullmatch(term.strip())
        if m is None:
            raise ArraySpecError(
                f"array spec {spec!r}: {term!r} is not N, N-M or N-M:S (digits 0-9)"
            )
        if any(g is not None and len(g) > _DIGITS_MAX for g in m.groups()):
            raise ArraySpecError(f"array spec {spec!r}: {term[:40]!r} passes index {INDEX_MAX}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        step = int(m[3]) if m[3] is not None else 1
        if hi > INDEX_MAX:
            raise ArraySpecError(f"array spec {spec!r}: {term!r} passes index {INDEX_MAX}")
        if hi < lo:
            raise ArraySpecError(f"array spec {spec!r}: {term!r} ends before it starts")
        if step < 1:
            raise ArraySpecError(f"array spec {spec!r}: the step of {term!r} must be at least 1")
        r = range(lo, hi + 1, step)
        total += len(r)
        if total > ARRAY_MAX:
            raise ArraySpecError(
                f"array spec {spec!r} has more than {ARRAY_MAX} elements (the limit per array)"
            )
        ranges.append(r)
    indices = sorted({i for r in ranges for i in r})
    return ArraySpec(tuple(indices), cap)


def format(spec: ArraySpec) -> str:
    """The normal form of a spec: runs of consecutive indices as N-M, others
    as N, comma-separated, then %K when capped ("0-3,7%2")."""
    parts: list[str] = []
    idx = spec.indices
    i = 0
    while i < len(idx):
        j = i
        while j + 1 < len(idx) and idx[j + 1] == idx[j] + 1:
            j += 1
        parts.append(str(idx[i]) if i == j else f"{idx[i]}-{idx[j]}")
        i = j + 1
    return ",".join(parts) + (f"%{spec.max_running}" if spec.max_running else "")
