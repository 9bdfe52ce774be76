"""The dashboard's words come from one table (rc.controller.wording), built
on the rc.proto enums and put into the page when it is assembled: every
member of every enum the page shows has its words, and the page's script
keeps no copy of them."""

from __future__ import annotations

import re

import orjson
import pytest

from rc.controller import dashboard, wording
from rc.proto.model import DeviceState, EventKind, JobState, QuarantineReason
from tests.helpers.harness import REPO

SCRIPT = (REPO / "rc/controller/static/dashboard.js").read_text()
STYLE = (REPO / "rc/controller/static/dashboard.css").read_text()


def test_every_member_of_every_enum_has_its_words():
    assert set(wording.DEVICE_STATES) == {*DeviceState, wording.DRAINING}
    assert sorted(wording.DEVICE_ORDER) == sorted(wording.DEVICE_STATES)
    assert set(wording.QUARANTINE) == set(QuarantineReason)
    assert set(wording.JOBS) == set(JobState)
    assert set(wording.EVENTS) == set(EventKind)
    assert wording.EVENTS[EventKind.SUBMITTED_AS].word  # the one the script's copy lacked


def test_every_word_can_be_drawn():
    glyphs = set(re.findall(r"^    (\w+): \[", SCRIPT[SCRIPT.index("const ICONS") :], re.MULTILINE))
    assert {s.icon for s in wording.DEVICE_STATES.values()} <= glyphs
    for state in wording.DEVICE_STATES:
        assert f".s-{state} " in STYLE, state
    assert {s.tone for s in wording.JOBS.values()} <= set(wording.DEVICE_STATES)
    assert {s.tone for s in wording.EVENTS.values()} <= set(wording.TONES)
    for tone in wording.TONES:
        assert f".kind.{tone} " in STYLE, tone


def test_the_page_carries_the_table():
    html = dashboard.page().html.decode()
    script = re.search(r"<script>(.*)</script>", html, re.DOTALL).group(1)
    literal = re.search(r"const WORDS = (\{.*?\});\n", script).group(1)
    assert orjson.loads(literal) == orjson.loads(orjson.dumps(wording.vocabulary()))
    assert "/*@words*/" not in html


def test_a_word_cannot_end_the_script():
    assert "<" not in dashboard.words_json()
    assert orjson.loads(dashboard.words_json().replace("\\u003c", "<")) is not None


@pytest.mark.parametrize(
    "value",
    [*(k.value for k in EventKind), *(r.value for r in QuarantineReason if r.value)],
)
def test_the_script_names_no_event_kind_or_quarantine_reason(value):
    assert not re.search(rf"[\"'`]{value}[\"'`]|\b{value}:", SCRIPT), value


@pytest.mark.parametrize(
    "word",
    [
        *(s.word for s in wording.EVENTS.values()),
        *(q.headline for q in wording.QUARANTINE.values()),
        *(s.word for s in wording.DEVICE_STATES.values()),
    ],
)
def test_the_script_keeps_no_copy_of_a_word(word):
    assert f'"{word}"' not in SCRIPT, word
