"""Label selectors: `model=h100,vram>=40G` (README "Selectors").

A selector is a conjunction of terms `key op value` joined by commas, with
whitespace around tokens ignored. Operators: = != >= <= > <.

Matching a term against a device's labels:
- a term on a label the device does not have never matches (`!=` included);
- when both sides are quantities (a number with an optional K/M/G/T suffix,
  powers of 1024, case-insensitive) they compare as numbers, so `vram>=40G`
  matches `81920M`;
- when neither side is a quantity they compare as strings (lexicographically
  for the ordered operators);
- an ordered comparison with exactly one side a quantity never matches (so
  `vram>=40G` never matches `[N/A]`); `=` and `!=` then compare as strings.

A lone `*` is the selector that matches every device (what `rc run` and
`rc hold` use when given neither a device nor a selector). `conjoin()` joins
several selectors into the one that requires them all (a repeated `-s`).

`parse()` raises SelectorError naming the bad term; `str(selector)` is the
normalised form that is stored and shown (`key<op>value` joined by commas, no
spaces), and parsing it again gives the same selector.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from rc.proto.errors import RcError

__all__ = [
    "ANY",
    "MAX_SELECTOR_LENGTH",
    "Selector",
    "SelectorError",
    "Term",
    "conjoin",
    "parse",
    "quantity",
    "valid_label_key",
]

MAX_SELECTOR_LENGTH = 4096
ANY = "*"
OPERATORS = ("!=", ">=", "<=", "=", ">", "<")
_FORBIDDEN = set("=!<>,")
_QUANTITY = re.compile(r"([+-]?\d+(?:\.\d+)?)([kmgt]?)", re.IGNORECASE)
_SCALE = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


class SelectorError(RcError, ValueError):
    """A selector could not be parsed; `term` is the offending term text."""

    def __init__(self, term: str, problem: str) -> None:
        super().__init__(f"bad selector term {term!r}: {problem}")
        self.term = term
        self.problem = problem


def valid_label_key(key: str) -> bool:
    """Whether a label name can be used in a selector term: non-empty,
    printable, no whitespace, none of = ! < > , (so `key op value` parses)."""
    return bool(key) and key.isprintable() and not any(c.isspace() or c in _FORBIDDEN for c in key)


def quantity(text: str) -> float | None:
    """The number `text` stands for ("40G" → 40·1024³), or None if it is not one."""
    m = _QUANTITY.fullmatch(text.strip())
    if m is None:
        return None
    return float(m.group(1)) * _SCALE[m.group(2).lower()]


@dataclass(frozen=True, slots=True)
class Term:
    """One `key op value` condition."""

    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a device with these effective labels satisfies the term."""
        have = labels.get(self.key)
        if have is None:
            return False
        a, b = quantity(have), quantity(self.value)
        if a is not None and b is not None:
            return _compare(self.op, a, b)
        if self.op in ("=", "!="):
            return _compare(self.op, have, self.value)
        if (a is None) != (b is None):
            return False
        return _compare(self.op, have, self.value)


def _compare(op: str, a, b) -> bool:
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    if op == ">=":
        return a >= b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    return a < b


@dataclass(frozen=True, slots=True)
class Selector:
    """A parsed selector: every term must match."""

    terms: tuple[Term, ...]

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.terms) if self.terms else ANY

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a device with these effective labels satisfies every term."""
        return all(t.matches(labels) for t in self.terms)


def parse(text: str) -> Selector:
    """Parse selector text. Raises SelectorError for any malformed term."""
    if not isinstance(text, str):
        raise SelectorError(repr(text), "a selector is a string")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorError(text[:40] + "...", f"longer than {MAX_SELECTOR_LENGTH} characters")
    if not text.strip():
        raise SelectorError(text, "the selector is empty")
    if text.strip() == ANY:
        return Selector(())
    return Selector(tuple(_parse_term(raw) for raw in text.split(",")))


def conjoin(texts: list[str]) -> str:
    """One selector text that requires every selector in `texts`: their terms
    joined by commas, with `*` (any device) dropping out; `*` when nothing is
    left. The texts are not parsed here: a malformed term stays in the result
    and `parse()` names it."""
    parts = [t.strip() for t in texts if t.strip() != ANY]
    return ",".join(parts) if parts else ANY


def _parse_term(raw: str) -> Term:
    term = raw.strip()
    if not term:
        raise SelectorError(raw, "empty term (two commas in a row, or a trailing comma?)")
    for i, ch in enumerate(term):
        if ch in "=!<>":
            break
    else:
        raise SelectorError(term, "no operator (use one of = != >= <= > <)")
    op = next((o for o in OPERATORS if term.startswith(o, i)), None)
    if op is None:
        raise SelectorError(term, "unknown operator (use one of = != >= <= > <)")
    key, value = term[:i].strip(), term[i + len(op) :].strip()
    if not key:
        raise SelectorError(term, "missing label name before the operator")
    if not value:
        raise SelectorError(term, "missing value after the operator")
    if any(c in _FORBIDDEN for c in value):
        raise SelectorError(term, "the value contains an operator character")
    if any(c.isspace() for c in key):
        raise SelectorError(term, "a label name cannot contain whitespace")
    if any(not c.isprintable() for c in key + value):
        raise SelectorError(term, "contains a control or other non-printable character")
    return Term(key, op, value)
