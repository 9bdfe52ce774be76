#!/usr/bin/env python3
"""Listings with long commands (README "Performance", "Limits").

One user queues `--jobs` jobs (default 1,000) whose commands are 256 KiB
each (the command limit), behind a hold that keeps the one device busy, so
every one of them stays queued. Then prints:
1. `GET /v1/state`: its size in bytes and the seconds it took
   (target <= 2 MB);
2. the controller's RSS before and after a dashboard-style load (`/v1/state`
   and the dashboard's listing, `/v1/jobs?limit=30`), and its peak
   (VmHWM) (target <= 150 MB);
3. `rc ps` (a CLI process reading `/v1/state`): wall seconds.

Loopback only, 1 CPU device, a fresh controller and worker.
Usage: python bench/listings.py [--jobs 1000] [--command-bytes 262144]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from fleet import ROOT, fleet

from rc.proto.client import Client

DASHBOARD_RECENT = 30
"""The jobs the dashboard's "Recent jobs" listing fetches (RECENT_FETCH in dashboard.js)."""


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process `pid` in MB (10^6 bytes)."""
    got = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                got[key] = int(value.split()[0]) * 1024 / 1e6
    return got["VmRSS"], got["VmHWM"]


def wait_running(c: Client, job_id: int, timeout: float = 60) -> None:
    """Long-poll job `job_id` until it runs."""
    state = ""
    deadline = time.monotonic() + timeout
    while state != "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id} did not start")
        state = c.get(f"/v1/jobs/{job_id}?wait=10&state={state}")["job"]["state"]


def queue_long_commands(url: str, token: str, jobs: int, command_bytes: int) -> float:
    """Queue `jobs` jobs of one `command_bytes`-byte command each (4 threads);
    returns the seconds it took."""
    arg = "x" * (command_bytes - len("echo"))
    body = {"command": ["echo", arg], "selector": "*"}
    local = threading.local()

    def submit(_) -> int:
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = Client(url, token, timeout=120)
        return c.post("/v1/jobs", body)["job"]["id"]

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        list(ex.map(submit, range(jobs)))
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--command-bytes", type=int, default=256 << 10)
    args = ap.parse_args()
    tmp = None
    try:
        with fleet(1) as (url, _admin, token, tmp, serve, _worker):
            measure(url, token, tmp, serve, args)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)  # a GB of queued commands


def measure(url: str, token: str, tmp, serve, args) -> None:
    """Queue the jobs and print the figures (see the module docstring)."""
    c = Client(url, token, timeout=300)
    hold = c.post(
        "/v1/jobs",
        {"kind": "hold", "selector": "*", "max_runtime_seconds": 3600, "reason": "bench"},
    )["job"]["id"]
    wait_running(c, hold)
    idle, _ = rss_mb(serve.pid)
    took = queue_long_commands(url, token, args.jobs, args.command_bytes)
    before, _ = rss_mb(serve.pid)
    t0 = time.monotonic()
    state = c.request("GET", "/v1/state").body
    state_s = time.monotonic() - t0
    queued = len(json.loads(state)["queued"])
    print(
        f"queued {queued} jobs of {args.command_bytes}-byte commands in {took:.1f} s",
        flush=True,
    )
    c.get("/v1/jobs", params={"limit": DASHBOARD_RECENT})
    after, peak = rss_mb(serve.pid)
    print(
        f"GET /v1/state: {len(state) / 1e6:.2f} MB in {state_s:.2f} s   (target <= 2 MB)",
        flush=True,
    )
    print(
        f"controller RSS: {idle:.0f} MB idle, {before:.0f} MB once they are queued, "
        f"{after:.0f} MB after a dashboard load (/v1/state + /v1/jobs?limit="
        f"{DASHBOARD_RECENT}), peak {peak:.0f} MB   "
        "(target <= 150 MB)",
        flush=True,
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RC_")},
        "RC_CONTROLLER": url,
        "RC_TOKEN": token,
        "HOME": str(tmp),
        "PYTHONPATH": str(ROOT),
    }
    t0 = time.monotonic()
    ps = subprocess.run(
        [sys.executable, "-m", "rc", "ps"], check=False, env=env, capture_output=True, timeout=600
    )
    ps_s = time.monotonic() - t0
    if ps.returncode != 0:
        raise RuntimeError(f"rc ps failed: {ps.stderr.decode()[-500:]}")
    lines = ps.stdout.count(b"\n")
    print(
        f"rc ps: {ps_s:.2f} s ({lines} lines, {len(ps.stdout) / 1e3:.0f} kB)",
        flush=True,
    )


if __name__ == "__main__":
    main()
