"""The selector language (README "Selectors"): parsing,
normalising and matching, by example and by property."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rc.proto import selector as sel
from rc.proto.selector import SelectorError, parse, quantity

settings.register_profile(
    "rc-selector",
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PROFILE = settings.get_profile("rc-selector")

H100 = {"model": "h100", "vram": "81920M", "driver": "580.173.02", "host": "a", "id": "a:g0"}
NA = {"model": "t4", "vram": "[N/A]", "host": "b"}


@pytest.mark.parametrize(
    "text, labels, want",
    [
        ("model=h100", H100, True),
        ("model = h100 ", H100, True),
        ("model=a100", H100, False),
        ("model!=a100", H100, True),
        ("vram>=40G", H100, True),  # sizes are powers of 1024: 40G = 40960M
        ("vram>=80G", H100, True),  # 80G = 81920M exactly
        ("vram>80G", H100, False),
        ("vram<=80g", H100, True),  # suffixes are case-insensitive
        ("vram<81921M", H100, True),
        ("vram=80G", H100, True),  # both quantities: numeric equality
        ("vram>=40G", NA, False),  # one side not a number: never
        ("vram<=40G", NA, False),
        ("vram<40G", NA, False),
        ("vram!=40G", NA, True),  # = and != fall back to string comparison
        ("vram=[N/A]", NA, True),
        ("missing=x", H100, False),  # a missing label never matches...
        ("missing!=x", H100, False),  # ...not even with !=
        ("missing<=9", H100, False),
        ("model>=a100", H100, True),  # both strings: lexicographic
        ("model<a100", H100, False),
        ("driver>=580.1", H100, False),  # dotted versions are strings; "580.1" is a number
        ("driver>=580.100.00", H100, True),
        ("model=h100,vram>=40G", H100, True),
        ("model=h100, vram>=100G", H100, False),
        ("host=a,id=a:g0", H100, True),
        ("*", H100, True),
        (" * ", {}, True),
    ],
)
def test_matching(text, labels, want):
    assert parse(text).matches(labels) is want


@pytest.mark.parametrize(
    "text, bad_term",
    [
        ("", ""),
        ("   ", "   "),
        ("model", "model"),
        ("model=h100,", ""),
        ("a=1,,b=2", ""),
        ("=h100", "=h100"),
        ("model=", "model="),
        ("model==h100", "model==h100"),
        ("model=>h100", "model=>h100"),
        ("vram<>3", "vram<>3"),
        ("a!b", "a!b"),
        ("a=b=c", "a=b=c"),
        ("gpu model=x", "gpu model=x"),
        ("a=\x00", "a=\x00"),
        ("*,a=b", "*"),
    ],
)
def test_parse_errors_name_the_bad_term(text, bad_term):
    with pytest.raises(SelectorError) as e:
        parse(text)
    assert e.value.term == bad_term
    assert repr(bad_term) in str(e.value)


def test_normalised_form_is_what_is_stored_and_shown():
    assert str(parse(" model = h100 ,  vram >= 40G ")) == "model=h100,vram>=40G"
    assert str(parse("*")) == "*"
    assert str(parse("a<b")) == "a<b"


def test_too_long_is_refused():
    with pytest.raises(SelectorError, match="longer than"):
        parse("a=" + "x" * sel.MAX_SELECTOR_LENGTH)


@pytest.mark.parametrize(
    "text, value",
    [
        ("40G", 40 * 1024**3),
        ("81920M", 81920 * 1024**2),
        ("1k", 1024),
        ("2T", 2 * 1024**4),
        ("1.5", 1.5),
        ("-3", -3.0),
        (" 7 ", 7.0),
        ("[N/A]", None),
        ("580.173.02", None),
        ("40GB", None),
        ("1e5", None),
        ("", None),
        ("inf", None),
        ("nan", None),
    ],
)
def test_quantities(text, value):
    assert quantity(text) == value


# ---------------------------------------------------------------- properties

KEYS = st.text(
    st.characters(blacklist_characters="=!<>,", blacklist_categories=("Cs", "Cc", "Z")),
    min_size=1,
    max_size=8,
).filter(lambda k: k.isprintable() and k.strip() == k)
VALUES = st.one_of(
    st.text(
        st.characters(blacklist_characters="=!<>,", blacklist_categories=("Cs", "Cc")),
        min_size=1,
        max_size=10,
    ).filter(lambda v: v.strip() and v.isprintable()),
    st.builds(lambda n, u: f"{n}{u}", st.integers(-(10**6), 10**6), st.sampled_from("kKmMgGtT ")),
)
TERMS = st.builds(lambda k, o, v: f"  {k} {o} {v} ", KEYS, st.sampled_from(sel.OPERATORS), VALUES)
SELECTORS = st.lists(TERMS, min_size=1, max_size=4).map(",".join)


@PROFILE
@given(SELECTORS)
def test_parse_normalise_parse_is_stable(text):
    first = parse(text)
    norm = str(first)
    again = parse(norm)
    assert again == first
    assert str(again) == norm


@PROFILE
@given(st.text(max_size=60))
def test_any_text_parses_or_raises_the_parse_error(text):
    try:
        s = parse(text)
    except SelectorError as e:
        assert isinstance(e, ValueError) and e.term is not None
        return
    assert parse(str(s)) == s
    s.matches({"a": "1", "b": "x"})


@PROFILE
@given(SELECTORS, st.dictionaries(KEYS, VALUES, max_size=5))
def test_matching_never_raises_and_missing_labels_never_match(text, labels):
    s = parse(text)
    result = s.matches(labels)
    if any(t.key.strip() not in labels for t in s.terms):
        assert result is False


@PROFILE
@given(
    st.integers(0, 10**6),
    st.sampled_from(["", "K", "M", "G", "T"]),
    st.integers(0, 10**6),
    st.sampled_from(["", "K", "M", "G", "T"]),
)
def test_numeric_rules_agree_with_arithmetic(a, ua, b, ub):
    scale = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
    have, want = a * scale[ua], b * scale[ub]
    labels = {"vram": f"{a}{ua}"}
    assert parse(f"vram>={b}{ub}").matches(labels) is (have >= want)
    assert parse(f"vram<={b}{ub}").matches(labels) is (have <= want)
    assert parse(f"vram>{b}{ub}").matches(labels) is (have > want)
    assert parse(f"vram<{b}{ub}").matches(labels) is (have < want)
    assert parse(f"vram={b}{ub}").matches(labels) is (have == want)
    assert parse(f"vram!={b}{ub}").matches(labels) is (have != want)


@PROFILE
@given(
    st.sampled_from([">=", "<=", ">", "<"]),
    st.integers(0, 10**4),
    st.text(st.characters(whitelist_categories=("Ll", "Lu", "P")), min_size=1, max_size=6).filter(
        lambda v: quantity(v) is None and not set(v) & set("=!<>,") and v.strip() == v
    ),
)
def test_ordered_comparison_with_one_number_never_matches(op, n, word):
    assert not parse(f"x{op}{n}G").matches({"x": word})
    assert not parse(f"x{op}{word}").matches({"x": f"{n}G"})


@PROFILE
@given(
    st.text(
        st.characters(blacklist_characters="=!<>,", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=8,
    ).filter(lambda v: v.strip() == v and v.isprintable()),
    st.text(
        st.characters(blacklist_characters="=!<>,", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=8,
    ).filter(lambda v: v.strip() == v and v.isprintable()),
)
def test_string_rules(a, b):
    if quantity(a) is not None or quantity(b) is not None:
        return
    labels = {"k": a}
    assert parse(f"k={b}").matches(labels) is (a == b)
    assert parse(f"k!={b}").matches(labels) is (a != b)
    assert parse(f"k>={b}").matches(labels) is (a >= b)
    assert parse(f"k<{b}").matches(labels) is (a < b)
