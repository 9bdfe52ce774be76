"""Revoking a token: the queued jobs it owns (its principal, never a
name's) are cancelled unless kept, and the in-memory token map follows each
change without being rebuilt."""

from __future__ import annotations

import pytest

from tests.helpers.harness import Cli, job
from tests.helpers.inprocess import Lab
from tests.helpers.wait import wait_until


@pytest.fixture
def lab(tmp_path, engine):
    """A Lab on each store engine (the engine fixture, tests/conftest.py)."""
    lb = Lab(tmp_path / "data")
    yield lb
    lb.close()


def test_rc_token_revoke_cancels_or_keeps_queued_jobs(controller, make_worker, env, tmp_path):
    make_worker(controller, host="rv", devices="cpu:1")
    admin = Cli(controller.url, controller.admin_token, env, tmp_path)
    users = {n: controller.client(controller.token(n)) for n in ("ann", "ben", "cat")}
    busy = users["cat"].post("/v1/jobs", {"command": ["sleep", "300"], "selector": "*"})["job"]
    c = controller.client()
    wait_until(lambda: job(c, busy["id"])["state"] == "running", 30, "cat's job to run")
    submit = lambda who: users[who].post("/v1/jobs", {"command": ["true"], "selector": "*"})
    anns = [submit("ann")["job"]["id"] for _ in range(2)]
    bens = submit("ben")["job"]["id"]
    try:
        res = admin.run("token", "revoke", "ann")
        assert res.returncode == 0, res.stderr
        assert res.stdout.decode() == (
            f"revoked token 'ann'; cancelled its 2 queued jobs ({anns[0]}, {anns[1]})\n"
        )
        for j in anns:
            got = job(c, j)
            assert (got["state"], got["kill_reason"]) == ("killed", "token revoked")
        res = admin.run("token", "revoke", "ben", "--keep-jobs")
        assert res.returncode == 0 and res.stdout == b"revoked token 'ben'\n", res
        assert job(c, bens)["state"] == "queued"
        # the revoked tokens stop working at once; the others still work
        gone = Cli(controller.url, "", env, tmp_path)
        for name in ("ann", "ben"):
            gone.env["RC_TOKEN"] = users[name].token
            res = gone.run("whoami")
            assert res.returncode == 1 and b"unauthorized" in res.stderr, res.stderr
        assert users["cat"].get("/v1/whoami")["name"] == "cat"
    finally:
        c.post(f"/v1/jobs/{busy['id']}/kill", {})
        c.post(f"/v1/jobs/{bens}/kill", {})
