"""What listings carry of long text (rc.proto.listed, README "Limits"):
cut() and cut_argv() keep at most LISTED_TEXT_CHARS with a visible mark,
argv_head() reads a command back from the start of its stored JSON, and the
SQL that reads those starts reads as many characters as the constants say."""

from __future__ import annotations

import json
import re

from hypothesis import example, given
from hypothesis import strategies as st

from rc.controller.store import db
from rc.proto.listed import (
    COMMAND_HEAD_CHARS,
    CUT_MARK,
    LISTED_TEXT_CHARS,
    TEXT_HEAD_CHARS,
    argv_head,
    cut,
    cut_argv,
    listed_chars,
)
from tests.helpers.harness import REPO

LIMIT = LISTED_TEXT_CHARS
# any text a command can hold: quotes, backslashes and control characters
# (escaped in JSON), non-ASCII and characters outside the BMP; no NUL
ARG = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=400)
ARGV = st.lists(ARG, max_size=40)


def test_the_documented_length_is_256_characters():
    assert LIMIT == 256 and CUT_MARK == "…"
    assert cut("x" * 256) == "x" * 256
    assert cut("x" * 257) == "x" * 255 + "…"


@given(st.text(max_size=600), st.integers(1, 300))
def test_cut_keeps_at_most_the_limit_and_marks_what_it_cut(text, limit):
    got = cut(text, limit)
    assert len(got) <= limit
    if len(text) <= limit:
        assert got == text
    else:
        assert len(got) == limit and got.endswith(CUT_MARK) and text.startswith(got[:-1])


@given(ARGV)
def test_cut_argv_keeps_at_most_the_limit_and_marks_what_it_cut(argv):
    got = cut_argv(argv)
    assert listed_chars(got) <= LIMIT
    if listed_chars(argv) <= LIMIT:
        assert got == tuple(argv)
        return
    assert got[-1].endswith(CUT_MARK)
    *kept, last = got
    assert tuple(argv[: len(kept)]) == tuple(kept)
    assert argv[len(kept)].startswith(last[: -len(CUT_MARK)])


def test_cut_argv_marks_a_command_cut_between_arguments_and_counts_spaces():
    assert cut_argv(("a" * 255, "b")) == ("a" * 255 + "…",)  # 255 + a space + 1 is 257
    assert cut_argv(("a" * 254, "b")) == ("a" * 254, "b")
    assert cut_argv(("",) * 300)[-1] == "…" and listed_chars(cut_argv(("",) * 300)) == LIMIT
    assert cut_argv(("echo", "hi"), whole=False) == ("echo", "hi…")
    assert cut_argv((), whole=False) == ("…",)
    assert cut_argv(()) == ()


@given(ARGV, st.data())
def test_argv_head_reads_back_what_any_start_of_the_json_holds(argv, data):
    text = db.dumps(argv)
    k = data.draw(st.integers(0, len(text)))
    if k == 0:
        return
    got, whole = argv_head(text[:k])
    assert whole == (k == len(text))
    if whole:
        assert got == tuple(argv)
        return
    assert len(got) <= len(argv)
    for i, arg in enumerate(got):
        assert argv[i] == arg if i < len(got) - 1 else argv[i].startswith(arg)


@given(st.lists(ARG, max_size=8), st.data())
def test_argv_head_leaves_out_an_escape_or_a_surrogate_pair_cut_in_half(argv, data):
    text = json.dumps(argv)  # ASCII only: every non-ASCII character an escape
    k = data.draw(st.integers(1, len(text)))
    got, _ = argv_head(text[:k])
    for i, arg in enumerate(got):
        assert argv[i].startswith(arg)
        arg.encode()  # no lone surrogate: it can go on the wire


@given(ARGV)
@example(["\x01" * 300])  # 6 characters of JSON each
@example([""] * 700)  # 3 each
@example(["\x01"] * 300)
@example(['"\\'] * 200)
def test_the_head_the_store_reads_is_enough_for_the_listed_command(argv):
    """COMMAND_HEAD_CHARS of the stored JSON give the command listed as the
    whole command would be, whatever its characters."""
    text = db.dumps(argv)
    assert cut_argv(*argv_head(text[:COMMAND_HEAD_CHARS])) == cut_argv(argv)


def test_argv_head_refuses_what_is_no_json_array_of_strings():
    for bad in ("", "{", '["a", 1]', '["a" "b"]', "x"):
        try:
            argv_head(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was taken")
    assert argv_head("[]") == ((), True)
    assert argv_head('[ "a" , "b" ]') == (("a", "b"), True)


def test_the_sql_reads_the_starts_the_constants_name():
    """Every listing query cuts where rc.proto.listed says: a command's first
    COMMAND_HEAD_CHARS, a reason's or an event's text's TEXT_HEAD_CHARS."""
    wants = {"command": COMMAND_HEAD_CHARS, "reason": TEXT_HEAD_CHARS,
             "kill_reason": TEXT_HEAD_CHARS, "text": TEXT_HEAD_CHARS}  # fmt: skip
    found = 0
    for path in ("queries.sql", "queries.pg.sql"):
        sql = (REPO / "rc" / "controller" / "store" / "sql" / path).read_text()
        for column, n in re.findall(r"substr\((?:\w+\.)?(\w+), 1, (\d+)\)", sql):
            if column in wants:
                assert int(n) == wants[column], (path, column, n)
                found += 1
    assert found >= 20
