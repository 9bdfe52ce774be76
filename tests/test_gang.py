"""Jobs on several devices of one host (issue 14), in-process on a fake clock
(tests.inprocess.Lab): what submit refuses, and how a wide job is granted,
kept and released."""

from __future__ import annotations

import pytest

from rc.controller.errors import Refused
from rc.proto.model import JobKind
from tests.inprocess import Lab


def refused(fn, *args, **kw) -> Refused:
    with pytest.raises(Refused) as e:
        fn(*args, **kw)
    return e.value


def cpu_host(n: int, ceiling: int = 0, **labels) -> dict:
    return {f"cpu{i}": (ceiling, {"kind": "cpu", **labels}) for i in range(n)}


def queued(lb: Lab) -> list[int]:
    return lb.read(lambda tx: [r["id"] for r in tx.all("queued_jobs")])


# ---------------------------------------------------------------- refused at submit


def test_bad_counts_and_pins_are_refused_naming_the_problem(lab):
    lb = lab()
    lb.register("a", cpu_host(3, model="x"))
    lb.register("b", cpu_host(2, model="x"))
    cases = [
        ({"count": 0}, "bad_request", "count 0 is outside 1..64"),
        ({"count": 65}, "bad_request", "count 65 is outside 1..64"),
        ({"device_ids": ("a:cpu0", "b:cpu0")}, "bad_request", "span hosts 'a', 'b'"),
        ({"device_ids": ("a:cpu0", "a:cpu0")}, "bad_request", "'a:cpu0' is pinned twice"),
        ({"device_ids": ("a:cpu0", "a:cpu1"), "count": 3}, "bad_request", "count 3 does not"),
        ({"device_ids": ("a:cpu0",), "device_id": "a:cpu0"}, "bad_request", "not both"),
        ({"device_ids": tuple(f"a:cpu{i}" for i in range(65))}, "bad_request", "at most 64"),
        ({"device_ids": ("a:cpu0", "a:cpu9")}, "unknown_device", "no device 'a:cpu9'"),
        # no host has 4 matching devices: the answer names the largest
        ({"count": 4, "selector": "model=x"}, "no_matching_device", "most on one host is 3 (on a)"),
        ({"count": 2, "selector": "host=b,device=cpu1"}, "no_matching_device", "is 1 (on b)"),
    ]
    for fields, code, words in cases:
        fields.setdefault(
            "selector", "" if "device_ids" in fields or "device_id" in fields else "*"
        )
        e = refused(lb.submit, **fields)
        assert (e.status, e.code) == (400, code), (fields, e.message)
        assert words in e.message, (fields, e.message)
    assert queued(lb) == []  # nothing was queued


def test_the_runtime_must_fit_the_ceiling_of_every_device_a_job_gets(lab):
    lb = lab()
    lb.register("a", {"cpu0": (600, {}), "cpu1": (3600, {}), "cpu2": (3600, {})})
    e = refused(lb.submit, device_ids=("a:cpu0", "a:cpu1"), max_runtime_seconds=1800)
    assert (e.code, e.message) == (
        "runtime_above_ceiling",
        "a:cpu0 allows at most 10m; asked for 30m",
    )
    e = refused(lb.submit, count=3, max_runtime_seconds=1800)
    assert e.code == "runtime_above_ceiling"
    assert "no host has 3 whose ceiling allows it (the most on one host is 2, on a)" in e.message
    lb.submit(count=2, max_runtime_seconds=1800)  # cpu1 and cpu2 allow it


def test_a_job_wider_than_the_per_user_cap_is_refused(lab):
    lb = lab(cap=2)
    lb.register("a", cpu_host(4))
    e = refused(lb.submit, count=3)
    assert e.code == "limit_exceeded"
    assert e.message == (
        "3 devices is more than the per-user cap of 2 (rc serve --max-devices-per-user); "
        "it could never start"
    )
    lb.submit(count=2, kind=JobKind.HOLD, max_runtime_seconds=60, reason="r")
