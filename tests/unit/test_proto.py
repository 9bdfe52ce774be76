"""rc.proto: the model, the strict codec, wire round trips, durations."""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rc.proto import model, wire
from rc.proto.codec import decode, encode
from rc.proto.duration import DurationError, format_duration, parse_duration, whole_seconds
from rc.proto.errors import WireError
from rc.proto.model import JobState, QuarantineReason, RecoveryProof, Stdio

# -- the recovery proof (seed: model.RecoveryProof) --------------------------


@given(st.booleans(), st.booleans(), st.booleans())
def test_recovery_proof_agrees_with_the_seed(isolated, checked, found):
    p = RecoveryProof(isolated, checked, found)
    # Seed: isolation answers outright; a survivor check only when it both ran
    # and came back empty; everything else proves nothing.
    assert p.proves() == (isolated or (checked and not found))
    # Summary is empty exactly when nothing is proven.
    assert (p.summary() == "") == (not p.proves())


def test_zero_proof_proves_nothing():
    assert not RecoveryProof().proves()
    assert RecoveryProof().summary() == ""
    assert not RecoveryProof(survivors_checked=True, survivors_found=True).proves()


def test_states_and_modes():
    assert {s for s in JobState if s.terminal} == {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.KILLED,
        JobState.LOST,
    }
    assert not JobState.RUNNING.terminal and JobState.RUNNING.active
    assert Stdio.TTY.attached and Stdio.PIPE.attached and not Stdio.LOGS.attached
    assert {r for r in QuarantineReason if r.reboot_clearable} == {
        QuarantineReason.WORKER_LOST,
        QuarantineReason.LEASE_EXPIRED,
        QuarantineReason.REGISTRATION,
    }


# -- JSON round trips for every record, orjson <-> json ----------------------

RECORDS = [
    obj
    for mod in (model, wire)
    for obj in vars(mod).values()
    if isinstance(obj, type) and dataclasses.is_dataclass(obj)
]

_text = st.text(max_size=12)
_float = st.floats(allow_nan=False, allow_infinity=False, width=64)
_int = st.integers(min_value=-(2**62), max_value=2**62)


def strategy(tp) -> st.SearchStrategy:
    """A strategy for any annotation the codec supports."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return st.builds(tp, **{f.name: strategy(hints[f.name]) for f in dataclasses.fields(tp)})
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[strategy(a) for a in typing.get_args(tp)])
    if origin is tuple:
        return st.lists(strategy(typing.get_args(tp)[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(_text, strategy(typing.get_args(tp)[1]), max_size=3)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return st.sampled_from(list(tp))
    return {str: _text, int: _int, float: _float, bool: st.booleans(), type(None): st.none()}[tp]


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_every_record_round_trips_through_both_json_libraries(cls):
    @settings(max_examples=25, deadline=None)
    @given(strategy(cls))
    def check(obj):
        via_orjson = orjson.dumps(encode(obj))
        # the controller replies with orjson's own serialization of the record
        assert orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) == via_orjson
        assert decode(cls, json.loads(via_orjson)) == obj
        via_json = json.dumps(encode(obj)).encode()
        assert decode(cls, orjson.loads(via_json)) == obj

    check()


# -- the codec refuses what does not fit ------------------------------------


def test_codec_names_the_bad_field():
    with pytest.raises(WireError, match=r"SubmitRequest\.priority must be an integer"):
        decode(wire.SubmitRequest, {"command": ["x"], "priority": "high"})
    with pytest.raises(WireError, match=r"SubmitRequest\.nope is not a known field"):
        decode(wire.SubmitRequest, {"nope": 1})
    with pytest.raises(WireError, match=r"RegisterRequest\.host is required"):
        decode(wire.RegisterRequest, {"devices": []})
    with pytest.raises(WireError, match=r"devices\[0\]\.name is required"):
        decode(wire.RegisterRequest, {"host": "h", "devices": [{}]})
    with pytest.raises(WireError, match=r"must be one of"):
        decode(wire.SubmitRequest, {"kind": "batch"})
    with pytest.raises(WireError, match=r"must be an object"):
        decode(wire.SubmitRequest, [1, 2])
    with pytest.raises(WireError, match=r"command\[1\] must be a string"):
        decode(wire.SubmitRequest, {"command": ["a", 2]})


def test_codec_keeps_bools_and_ints_apart():
    with pytest.raises(WireError):
        decode(wire.SubmitRequest, {"priority": True})
    with pytest.raises(WireError):
        decode(wire.SubmitRequest, {"no_wait": 1})
    assert decode(wire.SubmitRequest, {"priority": 3.0}).priority == 3


@given(
    st.recursive(
        st.none() | st.booleans() | _int | _float | _text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
        max_leaves=10,
    )
)
@settings(max_examples=200, deadline=None)
def test_codec_never_crashes_on_any_json(data):
    for cls in (wire.SubmitRequest, wire.RegisterRequest, wire.Reports):
        try:
            decode(cls, data)
        except WireError:
            pass


# -- durations ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("90s", 90),
        ("5m", 300),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1d", 86400),
        ("45", 45),
        ("250ms", 0.25),
        ("1w", 604800),
        (" 10s ", 10),
        ("1.5h", 5400),
        ("0", 0),
    ],
)
def test_durations_parse(text, seconds):
    assert parse_duration(text) == seconds


# "１０", "٣m", "1.５h": found by a new user, full-width digits were read as 10 s
@pytest.mark.parametrize(
    "text",
    ["", "5x", "m5", "-5s", "1h-", "1 h", "1e3s", "1000000000d", "１０", "٣m", "1.５h"],
)
def test_bad_durations_are_refused(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_whole_seconds_and_formatting():
    assert whole_seconds("2m") == 120
    with pytest.raises(DurationError, match="whole number of seconds"):
        whole_seconds("1500ms")
    assert format_duration(5400) == "1h30m"
    assert format_duration(0) == "0s"
    assert format_duration(93784) == "1d2h3m4s"


@given(st.integers(min_value=0, max_value=10**8))
def test_format_then_parse_is_identity(n):
    assert parse_duration(format_duration(n)) == n


@given(st.text(max_size=30))
def test_parse_duration_never_crashes(text):
    try:
        parse_duration(text)
    except DurationError:
        pass


def test_integers_beyond_64_bits_are_refused_naming_the_field():
    """Found by schemathesis: a job id above 2**63 in a report reached SQLite
    and answered 500."""
    with pytest.raises(WireError, match=r"reports\[0\]\.job_id is out of range"):
        decode(wire.Reports, {"reports": [{"job_id": 2**64, "state": "succeeded"}]})
    assert decode(wire.JobReport, {"job_id": 2**63 - 1, "state": "running"}).job_id == 2**63 - 1


@pytest.mark.parametrize("text", ["5m5m", "30m1h", "1s1m", "1h1h"])
def test_units_come_once_and_largest_first(text):
    """Found by a new user: `5m5m` and `30m1h` were accepted."""
    with pytest.raises(DurationError):
        parse_duration(text)


# -- the client vocabulary (rc.proto.calls) ------------------------------------


def test_a_calls_path_parameters_stay_one_segment_each():
    from rc.proto import calls
    from rc.proto.client import segment

    assert calls.JOB_GET.target(42) == "/v1/jobs/42"
    assert calls.SESSION_GET.target(7, 3) == "/v1/jobs/7/sessions/3"
    for typed in ("gpu1:gpu0", "hy:cpu1?drain", "a/b#c", "x y", "név@lab", ""):
        path = calls.DEVICE_CLEAR.target(typed)
        assert path == f"/v1/devices/{segment(typed)}/clear", typed
        assert path.count("/") == 4 and "?" not in path and "#" not in path, path
    assert calls.DEVICE_CLEAR.target("gpu1:gpu0") == "/v1/devices/gpu1:gpu0/clear"
    assert calls.TOKEN_REVOKE.target("alice@laptop") == "/v1/tokens/alice@laptop"
    assert calls.SESSION_RELAY.at(7, 3) == calls.RelayPaths(
        "/v1/jobs/7/sessions/3/tty/out",
        "/v1/jobs/7/sessions/3/tty/in",
        "/v1/jobs/7/sessions/3/tty/out",
        "/v1/jobs/7/sessions/3/tty/in",
    )
    for call, ids in ((calls.JOB_GET, ()), (calls.JOB_GET, (1, 2)), (calls.STATE, (1,))):
        with pytest.raises(TypeError, match="path parameter"):
            call.target(*ids)


def test_a_calls_body_is_its_record_or_some_of_its_fields():
    from rc.proto import calls

    # a record is encoded whole; a dict of its fields goes as it is
    assert calls.JOB_KILL.payload(wire.KillRequest("why")) == ({"reason": "why"}, None)
    assert calls.JOB_SUBMIT.payload({"command": ["true"]}) == ({"command": ["true"]}, None)
    # a POST without a body sends {}; a GET or a DELETE sends none
    assert calls.TOKEN_ROTATE.payload(None) == ({}, None)
    assert calls.JOB_KILL.payload(None) == ({}, None)
    assert calls.STATE.payload(None) == (None, None)
    assert calls.DEVICE_RETIRE.payload(None) == (None, None)
    # a raw body is bytes, kept as given
    chunk = memoryview(b"out")
    assert calls.LOG_APPEND.payload(chunk) == (None, chunk)
    for call, body, problem in (
        (calls.JOB_KILL, {"reasn": "typo"}, "KillRequest has no field reasn"),
        (calls.JOB_KILL, wire.ExtendRequest(5), "takes a KillRequest"),
        (calls.JOB_KILL, b"x", "takes a JSON body"),
        (calls.LOG_APPEND, {"offset": 0}, "takes bytes"),
        (calls.STATE, {"x": 1}, "takes no body"),
    ):
        with pytest.raises(TypeError, match=problem):
            call.payload(body)


def test_a_call_reads_only_its_own_query_parameters():
    from rc.proto import calls

    assert calls.JOB_GET.check_query({"detail": "1", "wait": None}) == {"detail": "1", "wait": None}
    assert calls.STATE.check_query(None) is None
    with pytest.raises(TypeError, match="reads no query parameter limt"):
        calls.JOBS.check_query({"limt": 5})
