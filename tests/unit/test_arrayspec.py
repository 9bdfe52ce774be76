"""The array SPEC parser (rc.proto.arrayspec): round trip, bounds, refusals."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rc.proto import arrayspec
from rc.proto.arrayspec import ARRAY_MAX, INDEX_MAX, ArraySpec, ArraySpecError

indices = st.lists(st.integers(0, INDEX_MAX), min_size=1, max_size=200, unique=True).map(
    lambda xs: tuple(sorted(xs))
)
caps = st.integers(0, ARRAY_MAX)


@given(indices, caps)
def test_the_normal_form_parses_back_to_the_same_spec(ids, cap):
    spec = ArraySpec(ids, cap)
    assert arrayspec.parse(arrayspec.format(spec)) == spec


term = st.tuples(st.integers(0, 2000), st.integers(0, 300), st.integers(1, 7))


@given(st.lists(term, min_size=1, max_size=8), caps)
def test_a_spec_means_the_union_of_its_terms(terms, cap):
    text = ",".join(f"{lo}-{lo + width}:{step}" for lo, width, step in terms)
    if cap:
        text += f"%{cap}"
    want = sorted({i for lo, width, step in terms for i in range(lo, lo + width + 1, step)})
    got = arrayspec.parse(text)
    assert got.indices == tuple(want) and got.max_running == cap
    assert len(got.indices) <= ARRAY_MAX
    assert arrayspec.parse(arrayspec.format(got)) == got


@given(st.text(max_size=30))
def test_any_text_parses_or_is_refused_by_name(text):
    try:
        got = arrayspec.parse(text)
    except ArraySpecError as e:
        assert str(e)
        return
    assert all(0 <= i <= INDEX_MAX for i in got.indices)
    assert len(got.indices) <= ARRAY_MAX and 0 <= got.max_running <= ARRAY_MAX


@pytest.mark.parametrize(
    "text,words",
    [
        ("5-1", "ends before it starts"),
        ("1-", "is not N, N-M or N-M:S"),
        ("a-b", "is not N, N-M or N-M:S"),
        ("%0", "must be from %1"),
        ("0-9%x", "is not a number"),
        ("", "empty"),
        ("0-9:0", "must be at least 1"),
        ("0-10000", "more than 10000 elements"),
        ("0-5000,5000-10000", "more than 10000 elements"),
        (f"{INDEX_MAX + 1}", f"passes index {INDEX_MAX}"),
        ("１-2", "is not N, N-M or N-M:S"),
        ("1" * 5000, f"passes index {INDEX_MAX}"),  # never int() of a huge number
        ("0-1:" + "9" * 5000, f"passes index {INDEX_MAX}"),
        ("0-3%" + "9" * 5000, "is not a number"),
    ],
)
def test_malformed_specs_are_refused_naming_the_problem(text, words):
    with pytest.raises(ArraySpecError, match=words.replace("%", "%")):
        arrayspec.parse(text)


def test_the_limits_themselves_are_allowed():
    assert len(arrayspec.parse("0-9999").indices) == ARRAY_MAX
    assert arrayspec.parse(f"{INDEX_MAX}%{ARRAY_MAX}") == ArraySpec((INDEX_MAX,), ARRAY_MAX)
    assert arrayspec.parse("%3") == ArraySpec((), 3)


def test_after_takes_a_job_id_and_a_known_condition():
    from rc.proto.model import Condition, parse_after

    assert parse_after("42") == (42, Condition.OK)
    assert parse_after("42:notok") == (42, Condition.NOTOK)
    for bad, words in (
        ("42:maybe", "unknown condition"),
        ("0", "is not a job id"),
        ("x:ok", "is not a job id"),
        ("٣", "is not a job id"),
        ("9" * 5000, "is not a job id"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_after(bad)
