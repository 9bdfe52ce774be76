"""One ErrorCode → HTTP status table (rc.proto.errors.STATUS): every code has
a status, a refusal takes its status from the table, and the README's limits
table says what the table says."""

from __future__ import annotations

import re

import pytest

from rc.controller.errors import Refused
from rc.proto.errors import SECOND_STATUS, STATUS, ErrorCode, statuses
from tests.helpers.harness import REPO


def test_every_code_has_one_status():
    assert set(STATUS) == set(ErrorCode)
    assert all(400 <= s < 600 for s in STATUS.values())
    assert set(SECOND_STATUS) <= set(ErrorCode)
    assert all(SECOND_STATUS[c] != STATUS[c] for c in SECOND_STATUS)


@pytest.mark.parametrize("code", list(ErrorCode))
def test_a_refusal_answers_with_its_codes_status(code):
    e = Refused(code, "why")
    assert (e.status, e.code, e.message) == (STATUS[code], code.value, "why")
    assert Refused(code.value, "why").status == STATUS[code]  # the wire string too


def test_a_second_status_only_where_the_table_gives_one():
    assert Refused(ErrorCode.LIMIT_EXCEEDED, "m", status=429).status == 429
    assert statuses(ErrorCode.LIMIT_EXCEEDED) == (400, 429)
    assert statuses(ErrorCode.QUEUE_FULL) == (429,)
    with pytest.raises(ValueError, match="never 429"):
        Refused(ErrorCode.BAD_REQUEST, "m", status=429)
    with pytest.raises(ValueError, match="needs an ErrorCode"):
        Refused(400, "m")  # the old (status, code, message) order


def test_the_readme_limits_table_agrees_with_the_status_table():
    text = (REPO / "README.md").read_text()
    table = text[text.index("**Limits.**") : text.index("**Fuzzing.**")]
    found = re.findall(r"\| (\d{3}) `([a-z_]+)` \|", table)
    assert len(found) >= 10, found
    for status, code in found:
        assert int(status) in statuses(ErrorCode(code)), (status, code)


def test_the_readme_refusals_at_submit_are_400s():
    text = (REPO / "README.md").read_text()
    table = text[text.index("| code (HTTP 400) | when |") : text.index("### Runtime ceilings")]
    codes = re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE)
    # the five of one device, the priority policy, bad counts or pins, the cap
    assert len(codes) == 8, codes
    assert {STATUS[ErrorCode(c)] for c in codes} == {400}
