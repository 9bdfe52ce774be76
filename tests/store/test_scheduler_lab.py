"""The real store and scheduler in-process, on a fake clock (tests.helpers.inprocess):
submit-time refusals, ceilings, idempotency, and starvation.
"""

from __future__ import annotations

import asyncio

import pytest

from rc.controller.errors import Refused
from rc.controller.store import jobs, queue
from rc.controller.submission import validate_submit
from rc.proto.model import PRIORITY_MAX, PRIORITY_MIN, JobKind, JobState, Stdio
from rc.proto.wire import SubmitRequest
from tests.helpers.inprocess import Lab, local_user

pytestmark = pytest.mark.usefixtures("engine")  # each test on SQLite, then PostgreSQL


def refused(fn, *args, **kw) -> Refused:
    with pytest.raises(Refused) as e:
        fn(*args, **kw)
    return e.value


# ---------------------------------------------------------------- submit-time rules


def two_hosts(lb: Lab) -> None:
    lb.register(
        "a",
        {
            "g0": (3600, {"model": "h100", "vram": "81920M"}),
            "g1": (0, {"model": "h100", "vram": "81920M"}),
        },
    )
    lb.register("b", {"g0": (600, {"model": "a100", "vram": "[N/A]"})})


def test_refused_at_submit_with_their_error_codes(lab):
    lb = lab()
    two_hosts(lb)
    cases = [
        ({"selector": "model=tpu"}, 400, "no_matching_device"),
        ({"selector": "vram>=40G,model=a100"}, 400, "no_matching_device"),  # [N/A] never
        ({"device_id": "a:g9"}, 400, "unknown_device"),
        ({"device_id": "b:g0", "max_runtime_seconds": 601}, 400, "runtime_above_ceiling"),
        ({"selector": "model=a100", "max_runtime_seconds": 7200}, 400, "runtime_above_ceiling"),
        ({"priority": PRIORITY_MAX + 1}, 400, "priority_out_of_range"),
        ({"priority": PRIORITY_MIN - 1}, 400, "priority_out_of_range"),
        ({"selector": "model==h100"}, 400, "bad_selector"),
        (
            {"kind": JobKind.HOLD, "command": ("sh",), "max_runtime_seconds": 60, "reason": "x"},
            400,
            "bad_request",
        ),
        (
            {"kind": JobKind.HOLD, "cwd": "/tmp", "max_runtime_seconds": 60, "reason": "x"},
            400,
            "bad_request",
        ),
        (
            {"kind": JobKind.HOLD, "env": {"A": "1"}, "max_runtime_seconds": 60, "reason": "x"},
            400,
            "bad_request",
        ),
        (
            {
                "kind": JobKind.HOLD,
                "idle_timeout_seconds": 5,
                "max_runtime_seconds": 60,
                "reason": "x",
            },
            400,
            "bad_request",
        ),
        (
            {"kind": JobKind.HOLD, "stdio": Stdio.TTY, "max_runtime_seconds": 60, "reason": "x"},
            400,
            "bad_request",
        ),
        ({"kind": JobKind.HOLD, "max_runtime_seconds": 60, "reason": "  "}, 400, "bad_request"),
        ({"kind": JobKind.HOLD, "reason": "x"}, 400, "bad_request"),  # no ttl
    ]
    for fields, status, code in cases:
        e = refused(lb.submit, **fields)
        assert (e.status, e.code) == (status, code), fields
    e = refused(lb.submit, selector="model=a100", max_runtime_seconds=7200)
    assert "is 10m" in e.message and "asked for 2h" in e.message  # the highest ceiling, as typed
    e = refused(lb.submit, selector="model==h100")
    assert "'model==h100'" in e.message  # names the bad term
    assert lb.read(queue.queued) == []
    # a runtime above some ceilings is fine when one candidate allows it: never clamped
    job_id, _ = lb.submit(selector="model=h100", max_runtime_seconds=7200)
    j = lb.job(job_id)
    assert (j.device_id, j.max_runtime_seconds) == ("a:g1", 7200)


def test_a_job_without_a_runtime_inherits_the_ceiling_where_it_lands(lab):
    lb = lab()
    two_hosts(lb)
    pinned, _ = lb.submit(device_id="b:g0")
    sel, _ = lb.submit(selector="vram>=40G")  # lands on a:g0 (first free match)
    own, _ = lb.submit(selector="model=h100", max_runtime_seconds=60)
    assert (lb.job(pinned).device_id, lb.job(pinned).max_runtime_seconds) == ("b:g0", 600)
    assert (lb.job(sel).device_id, lb.job(sel).max_runtime_seconds) == ("a:g0", 3600)
    assert (lb.job(own).device_id, lb.job(own).max_runtime_seconds) == ("a:g1", 60)


def test_a_queued_pinned_job_takes_the_ceiling_its_device_has_when_it_lands(lab):
    lb = lab()
    lb.register("a", {"g0": (3600, {})})
    first, _ = lb.submit(device_id="a:g0")
    queued, _ = lb.submit(device_id="a:g0")
    assert lb.job(queued).max_runtime_seconds == 0  # nothing inherited while queued
    # the host reboots with a lower ceiling: the first job is lost, the device freed
    lb.register("a", {"g0": (1800, {})}, boot_id="boot-2")
    assert lb.job(first).state is JobState.LOST
    j = lb.job(queued)
    assert (j.state, j.max_runtime_seconds) == (JobState.ASSIGNED, 1800)


def test_idempotency(lab):
    lb = lab()
    two_hosts(lb)
    a, created = lb.submit(idempotency_key="k", command=("echo", "1"))
    b, again = lb.submit(idempotency_key="k", command=("echo", "1"))
    assert (a, created, again) == (b, True, False)
    e = refused(lb.submit, idempotency_key="k", command=("echo", "2"))
    assert (e.status, e.code) == (409, "idempotency_conflict")
    # another principal's key is its own: a new job, never someone else's
    # (it was a 409 when keys were global; a lab trial: a key must not let
    # anyone learn of, or reach, another owner's job)
    c, made = lb.submit(who="bob", idempotency_key="k", command=("echo", "2"))
    assert made and c != a and lb.job(c).owner != lb.job(a).owner
    assert lb.submit(who="bob", idempotency_key="k", command=("echo", "2")) == (c, False)
    # a token named like the local user is another principal too
    tok = lb.token("alice")
    d, made = lb.submit(tok, idempotency_key="k", command=("echo", "1"))
    assert made and d not in (a, c)


def test_concurrent_duplicates_make_exactly_one_job(lab):
    lb = lab()
    two_hosts(lb)
    req = validate_submit(
        SubmitRequest(command=("true",), selector="*", idempotency_key="dup"),
        local_user("alice"),
        lb.ctl.cfg.limits,
    )

    async def many():
        return await asyncio.gather(
            *[lb.ctl.db.write(jobs.enqueue, req, lb.ctl.match_cache) for _ in range(25)]
        )

    out = lb.run(many())
    assert len({job_id for job_id, _ in out}) == 1
    assert sum(created for _, created in out) == 1
    assert (
        lb.read(
            lambda tx: len(
                tx.all(
                    "jobs_list",
                    {
                        "device": "",
                        "user": "",
                        "owner": "",
                        "states": "[]",
                        "name": "",
                        "since": 0,
                        "array": 0,
                        "before": 0,
                        "limit": 100,
                    },
                )
            )
        )
        == 1
    )


# ---------------------------------------------------------------- starvation

STEP_S = 10.0
AGING_S = 60.0


def stream(lb: Lab, steps: int) -> float | None:
    """One device; an old priority -10 job waits while a stream of priority 10
    jobs arrives, one per STEP_S, each freeing the device as the next arrives.
    Returns how long the old job waited before it started (None: never)."""
    lb.register("a", {"g0": (0, {})})
    running, _ = lb.submit(priority=PRIORITY_MAX)
    old, _ = lb.submit(priority=PRIORITY_MIN)
    start = lb.now
    for _ in range(steps):
        lb.now += STEP_S
        lb.submit(priority=PRIORITY_MAX)
        lb.finish(running)
        running = lb.running_on("a:g0")
        if running == old:
            return lb.now - start
    return None


def test_a_stream_of_high_priority_jobs_does_not_starve_an_old_one(lab):
    waited = stream(lab(aging=AGING_S), steps=400)
    # the aging bound: one step per AGING_S closes the 20-step gap, then the
    # next time the device frees it is the old job's
    bound = (PRIORITY_MAX - PRIORITY_MIN) * AGING_S + STEP_S
    assert waited is not None and waited <= bound, waited


def test_without_aging_the_same_stream_starves_it(lab):
    assert stream(lab(aging=0), steps=150) is None
