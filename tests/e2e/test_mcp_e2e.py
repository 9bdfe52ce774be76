"""`rc mcp` (README "Agents: rc mcp") driven by the MCP Python SDK's own
client over stdio, against a real controller and a real worker: read-only
by default, --allow submit,kill adds the writes, each in the activity feed
"via mcp"; someone else's logs and jobs are refused; no SDK, a clear error."""

from __future__ import annotations

import json
import subprocess
import sys

import anyio
import pytest

import rc.api
from rc.cli.mcp import READ_ONLY
from rc.proto import calls
from tests.helpers.harness import BARE_PY, PY, REPO

mcp = pytest.importorskip("mcp")  # the test extra installs it (pyproject.toml)
CALL_TIMEOUT_S = 90.0


@pytest.fixture
def box(controller, make_worker):
    make_worker(controller, host="box", devices="cpu:2")
    return controller


def _session(box, env, token: str, *allow: str):
    """Run `body(client)` against `rc mcp [--allow ...]` as the token's user."""
    params = mcp.StdioServerParameters(
        command=PY,
        args=["-m", "rc", "mcp", *(("--allow", ",".join(allow)) if allow else ())],
        env={**env, "RC_CONTROLLER": box.url, "RC_TOKEN": token},
        cwd=str(REPO),
    )

    def run(body):
        async def main():
            with anyio.fail_after(CALL_TIMEOUT_S):
                async with mcp.Client(params) as client:
                    return await body(client)

        return anyio.run(main)

    return run


def _answer(result) -> dict:
    """A tool's answer: the JSON of its text content (an error's text as {"error": ...})."""
    text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
    if result.is_error:
        return {"error": text}
    return json.loads(text)


def test_read_only_by_default(box, env):
    alice = box.token("alice")
    job = rc.api.connect(controller=box.url, token=alice).submit(["echo", "hello agent"])
    job.wait(timeout=60)

    async def body(client):
        tools = (await client.list_tools()).tools
        out = {"names": sorted(t.name for t in tools), "tools": tools}
        out["who"] = _answer(await client.call_tool("whoami", {}))
        out["jobs"] = _answer(await client.call_tool("list_jobs", {"limit": 5}))
        out["logs"] = _answer(await client.call_tool("job_logs", {"job_id": job.id}))
        out["devices"] = _answer(await client.call_tool("list_devices", {}))
        out["sel"] = _answer(await client.call_tool("explain_selector", {"selector": "*"}))
        out["submit"] = await client.call_tool("submit_job", {"command": ["true"]})
        out["limit"] = _answer(await client.call_tool("list_jobs", {"limit": 10_000}))
        return out

    got = _session(box, env, alice)(body)
    assert got["names"] == sorted(READ_ONLY)  # no write without --allow
    assert all(t.annotations.read_only_hint for t in got["tools"])
    assert got["who"]["name"] == "alice" and got["who"]["allowed_writes"] == []
    assert [j["id"] for j in got["jobs"]["jobs"]] == [job.id]
    assert got["logs"]["log"] == "hello agent\n" and got["logs"]["state"] == "succeeded"
    assert sorted(d["device"]["id"] for d in got["devices"]["devices"]) == ["box:cpu0", "box:cpu1"]
    assert sorted(got["sel"]["free"]) == ["box:cpu0", "box:cpu1"]
    assert got["submit"].is_error  # an unknown tool here
    assert "limit is 1..200" in got["limit"]["error"]


def test_writes_when_allowed_each_in_the_feed_via_mcp(box, env):
    alice = box.token("alice")
    bob_job = rc.api.connect(controller=box.url, token=box.token("bob")).submit(["sleep", "30"])

    async def body(client):
        out = {"tools": {t.name: t for t in (await client.list_tools()).tools}}
        sub = _answer(
            await client.call_tool(
                "submit_job",
                {"command": ["sh", "-c", "echo from-mcp $X"], "env": {"X": "y"}, "name": "agent"},
            )
        )
        job_id = sub["job"]["id"]
        out["sub"] = sub
        out["waited"] = _answer(
            await client.call_tool("wait_job", {"job_id": job_id, "timeout_seconds": 60})
        )
        out["logs"] = _answer(await client.call_tool("job_logs", {"job_id": job_id}))
        long = _answer(await client.call_tool("submit_job", {"command": ["sleep", "60"]}))
        out["long"] = long["job"]["id"]
        out["kill"] = _answer(
            await client.call_tool("kill_job", {"job_id": out["long"], "reason": "agent"})
        )
        out["bobs_logs"] = _answer(await client.call_tool("job_logs", {"job_id": bob_job.id}))
        out["bobs_kill"] = _answer(await client.call_tool("kill_job", {"job_id": bob_job.id}))
        out["refused"] = _answer(
            await client.call_tool("submit_job", {"command": ["true"], "selector": "kind="})
        )
        return out

    got = _session(box, env, alice, "submit", "kill")(body)
    assert {"submit_job", "kill_job"} <= set(got["tools"])
    assert "COSTS" in got["tools"]["submit_job"].description
    assert got["tools"]["kill_job"].annotations.destructive_hint
    job_id = got["sub"]["job"]["id"]
    assert got["waited"]["ended"] and got["waited"]["job"]["state"] == "succeeded"
    assert got["logs"]["log"] == "from-mcp y\n"
    assert "kill requested" in got["kill"]["message"] or "killed" in got["kill"]["message"]
    assert "belongs to bob" in got["bobs_logs"]["error"]
    assert "belongs to bob" in got["bobs_kill"]["error"]
    assert "bad_selector: bad selector term" in got["refused"]["error"]
    assert rc.api.connect(controller=box.url, token=box.admin_token).job(bob_job.id).state == (
        "running"
    )
    feed = box.client().call(calls.EVENTS, params={"limit": 1000})["events"]
    via = [(e["kind"], e["job_id"]) for e in feed if e["text"].endswith("via mcp")]
    assert via == [
        ("job_submitted", job_id),
        ("job_submitted", got["long"]),
        ("job_killed", got["long"]),
    ]
    assert all(e["actor"].startswith("alice") for e in feed if e["text"].endswith("via mcp"))
    bob_job.kill()


def test_without_the_sdk_it_names_the_extra(pyz, box, env):
    """The zipapp (no third-party packages: a bare interpreter, -I) has rc
    mcp, which says how to install what it needs instead of a traceback."""
    got = subprocess.run(
        [BARE_PY, "-I", str(pyz), "mcp"],
        check=False,
        capture_output=True,
        timeout=30,
        env={**env, "RC_CONTROLLER": box.url, "RC_TOKEN": box.token("carol")},
        stdin=subprocess.DEVNULL,
    )
    if b"needs the MCP" not in got.stderr and got.returncode == 0:
        pytest.skip(f"{BARE_PY} has the MCP SDK installed")
    assert got.returncode == 1
    assert b"pip install 'rc[mcp]'" in got.stderr and b"Traceback" not in got.stderr
    assert got.stdout == b""


def test_a_bad_token_fails_before_serving(box, env):
    got = subprocess.run(
        [sys.executable, "-m", "rc", "mcp"],
        check=False,
        capture_output=True,
        timeout=30,
        env={**env, "RC_CONTROLLER": box.url, "RC_TOKEN": "rc_not_a_token"},
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    assert got.returncode == 1 and b"unauthorized" in got.stderr and got.stdout == b""
