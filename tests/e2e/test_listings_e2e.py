"""Listings stay small, end to end (README "Limits"): a real controller, the
CLI and the routes the dashboard reads. Found in a lab trial: 1,000 queued
jobs of 256 KiB commands made `GET /v1/state` 201 MB (3.8 s), the controller
1.37 GB after one dashboard load, and `rc ps` 4.5 s."""

from __future__ import annotations

import pytest

from rc.proto.client import Client
from rc.proto.errors import ApiError
from rc.proto.listed import CUT_MARK, LISTED_TEXT_CHARS, listed_chars
from tests.helpers.harness import Cli

LONG = ["echo", "x" * ((256 << 10) - 4)]
"""A command at the limit: 256 KiB of arguments."""
REASON = "r" * 4000


@pytest.fixture
def drained(controller):
    """A worker of host `tl` (cpu0) spoken for over HTTP, drained by an admin
    with a long reason (so jobs stay queued, and the feed has a long text)."""
    worker = Client(controller.url, controller.token("w-tl", "worker"))
    worker.post("/v1/workers/register", {"host": "tl", "devices": [{"name": "cpu0"}]})
    admin = controller.client()
    admin.post("/v1/devices/tl:cpu0/drain", {"reason": REASON})
    yield admin
    worker.close_all()


def _cut(job: dict) -> bool:
    """Whether `job` carries LONG and REASON as listings do."""
    argv = job["command"]
    return (
        listed_chars(argv) <= LISTED_TEXT_CHARS
        and argv[-1].endswith(CUT_MARK)
        and LONG[1].startswith(argv[-1][:-1])
        and len(job["reason"]) == LISTED_TEXT_CHARS
        and job["reason"].endswith(CUT_MARK)
    )


def test_listings_state_and_feed_carry_a_256_kib_command_cut_show_carries_it_whole(
    controller, drained, env, tmp_path
):
    alice = Client(controller.url, controller.token("alice"))
    job_id = alice.post("/v1/jobs", {"command": LONG, "selector": "*", "reason": REASON})["job"][
        "id"
    ]
    cli = Cli(controller.url, alice.token, env, tmp_path)

    listing = alice.request("GET", "/v1/jobs", params={"limit": 30})
    state = alice.request("GET", "/v1/state")
    assert len(listing.body) < 8192 and len(state.body) < 8192, "the dashboard's two reads"
    [listed] = listing.json()["jobs"]
    [queued] = state.json()["queued"]
    assert _cut(listed) and _cut(queued)
    assert _cut(cli.json("jobs")[0])
    assert _cut(cli.json("ps")["queued"][0])
    ps = cli.run("ps", check=True).stdout.decode()
    # the command first, its reason beside it (past the cut here), never instead of it
    row = ps.splitlines()[1]
    assert "echo 'xxx" in row and row.endswith("…") and "rrr" not in row and len(ps) < 2048

    feed = controller.client().get("/v1/events")["events"]
    drained_event = next(e for e in feed if e["kind"] == "device_drained")
    assert len(drained_event["text"]) <= LISTED_TEXT_CHARS
    assert drained_event["text"].endswith(CUT_MARK)
    assert all(len(e["text"]) <= LISTED_TEXT_CHARS for e in cli.json("events"))

    # GET /v1/jobs/ID and rc show carry it whole
    whole = alice.get(f"/v1/jobs/{job_id}")["job"]
    assert whole["command"] == LONG and whole["reason"] == REASON
    shown = cli.json("show", str(job_id))["job"]
    assert shown["command"] == LONG and shown["reason"] == REASON


def test_the_budget_of_queued_spec_bytes_refuses_a_submit_and_keeps_earlier_jobs(
    make_controller, env, tmp_path
):
    ctl = make_controller("--max-queued-spec-bytes", "300000")
    worker = Client(ctl.url, ctl.token("w-tl", "worker"))
    worker.post("/v1/workers/register", {"host": "tl", "devices": [{"name": "cpu0"}]})
    ctl.client().post("/v1/devices/tl:cpu0/drain", {"reason": "keep them queued"})
    alice = Client(ctl.url, ctl.token("alice"))
    first = alice.post("/v1/jobs", {"command": LONG, "selector": "*"})["job"]["id"]
    with pytest.raises(ApiError) as e:
        alice.post("/v1/jobs", {"command": ["echo", "y" * 50_000], "selector": "*"})
    assert (e.value.status, e.value.code) == (429, "queued_spec_bytes")
    assert "budget of 300,000 bytes (293.0 KiB)" in e.value.message
    assert "alice has 262,153 bytes (256.0 KiB) of job specs queued" in e.value.message
    # the CLI says so and exits 1; what was queued stays, nothing refused was
    cli = Cli(ctl.url, alice.token, env, tmp_path)
    res = cli.run("run", "--detach", "--", "echo", "y" * 50_000)
    assert res.returncode == 1, res
    assert res.stderr.startswith(b"rc: queued_spec_bytes: alice has 262,153 bytes"), res.stderr
    assert [j["id"] for j in alice.get("/v1/jobs")["jobs"]] == [first]
    assert alice.get(f"/v1/jobs/{first}")["job"]["state"] == "queued"
    # a small one still fits
    alice.post("/v1/jobs", {"command": ["true"], "selector": "*"})
    worker.close_all()
