#!/usr/bin/env python3
"""Dispatch benchmark (README "Performance").

Starts a controller and a worker with 4 CPU devices on loopback, then prints:
1. submit → job process started: median and p99 over 100 jobs on an idle
   fleet (the client stamps the time before sending the submit; the job's
   first act is `date +%s.%N` into a file);
2. 1,000 `true` jobs end to end (8 submitting threads; from the first submit
   to the last job's terminal state): jobs/s, and the controller's HTTP
   requests per job over them (rc_http_requests_total);
   then the same for N `echo x` jobs (each prints one line), with the log
   uploads per job (rc_log_uploads_total, when the controller has it), beside
   the `true` figure: what a job's output costs in requests;
3. kill → process gone: median over 20 kills of a running `sleep`;
4. the wait of a 4-device job submitted amid a stream of 1-device jobs
   (half with a --max-runtime, half without) that keeps every device busy,
   against the start its reservation promised (conservative backfill: a
   narrow job may take a reserved device only if it ends before then).

Targets (README "Performance"): submit → start p50 ≤ 5 ms,
p99 ≤ 15 ms; ≥ 500 jobs/s; ≤ 1.2 requests per job; kill ≤ 4 ms. The peers on
this machine (PEERS): Slurm 22.05 tuned, p50 622 ms (sbatch) / 40 ms (srun),
55 jobs/s, kill 7.8 ms; task-spooler, p50 3.6 ms, 760 jobs/s, kill 2.6 ms.
Usage: python bench/dispatch.py [--jobs 1000]; RC_BENCH_WORKER_CONFIG adds
worker config keys (`cgroup_root = "/tmp/x"` measures the scan mode).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from fleet import fleet, percentile

from rc.proto.client import Client

PEERS = {
    "start": "here: Slurm p50 622 ms (sbatch), 40 ms (srun); task-spooler p50 3.6 ms",
    "throughput": "here: Slurm 55 jobs/s, task-spooler 760 jobs/s",
    "kill": "here: Slurm 7.8 ms, task-spooler 2.6 ms",
}
"""The peers' figures on this machine, one sitting, their best settings."""


def wait(pred, timeout: float, what: str, interval: float = 0.0005):
    """Poll `pred` every `interval` seconds (cheap local checks may poll fast;
    anything that asks the controller should poll slowly, or it becomes load)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(interval)


def latency(url: str, token: str, tmp: Path, n: int) -> list[float]:
    c = Client(url, token)
    out = []
    for i in range(n + 5):
        stamp = tmp / f"start-{i}"
        t0 = time.time()
        job = c.post(
            "/v1/jobs",
            {
                "command": ["sh", "-c", f"date +%s.%N > {stamp}"],
                "selector": "*",
                "idempotency_key": uuid.uuid4().hex,
            },
        )["job"]
        wait(lambda: stamp.exists() and stamp.stat().st_size > 0, 30, "job start")
        started = float(stamp.read_text())
        if i >= 5:  # the first few warm up connections and caches
            out.append(started - t0)
        wait(
            lambda: c.get(f"/v1/jobs/{job['id']}")["job"]["state"] == "succeeded",
            30,
            "job end",
            interval=0.01,
        )
    return out


def throughput(
    url: str, token: str, total: int, threads: int = 8, command: tuple[str, ...] = ("true",)
) -> tuple[float, float]:
    local = threading.local()

    def submit(_) -> int:
        c = getattr(local, "c", None)
        if c is None:
            c = local.c = Client(url, token)
        return c.post("/v1/jobs", {"command": list(command), "selector": "*"})["job"]["id"]

    watcher = Client(url, token)
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        last = max(ex.map(submit, range(total)))
    t_submitted = time.monotonic() - t0

    # The newest job ends about last (FIFO): long-poll it rather than poll the
    # whole queue, so watching costs the controller next to nothing.
    state, position = "", ""
    deadline = time.monotonic() + 600
    while state not in ("succeeded", "failed", "killed", "lost"):
        if time.monotonic() > deadline:
            raise RuntimeError("timed out: all jobs to finish")
        view = watcher.get(f"/v1/jobs/{last}?wait=30&state={state}&position={position}")
        state, position = view["job"]["state"], view["queue_position"]

    def done():
        st = watcher.get("/v1/state")
        return not st["jobs"] and not st["queued"]

    wait(done, 600, "all jobs to finish", interval=0.02)
    elapsed = time.monotonic() - t0
    return total / elapsed, total / t_submitted


def requests_served(url: str, token: str) -> dict[str, float]:
    """The controller's rc_http_requests_total by side ("worker", "client")."""
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("rc_http_requests_total{"):
            side = line.split('side="', 1)[1].split('"', 1)[0]
            out[side] = float(line.rsplit(" ", 1)[1])
    return out


def log_uploads(url: str, token: str) -> float | None:
    """The controller's rc_log_uploads_total (None: a controller without it)."""
    req = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("rc_log_uploads_total "):
                return float(line.rsplit(" ", 1)[1])
    return None


def kill_latency(url: str, token: str, tmp: Path, n: int) -> list[float]:
    c = Client(url, token)
    out = []
    for i in range(n):
        pidfile = tmp / f"pid-{i}"
        job = c.post(
            "/v1/jobs",
            {"command": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 1000"], "selector": "*"},
        )["job"]
        wait(lambda: pidfile.exists() and pidfile.read_text().strip(), 30, "job pid")
        pid = int(pidfile.read_text())
        t0 = time.monotonic()
        c.post(f"/v1/jobs/{job['id']}/kill", {})
        wait(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 30, "process gone")
        out.append(time.monotonic() - t0)
        wait(
            lambda: c.get(f"/v1/jobs/{job['id']}")["job"]["state"] == "killed",
            30,
            "killed",
            interval=0.01,
        )
    return out


def wide_amid_narrow(url: str, token: str, seconds: float = 20.0) -> tuple[float, float, int]:
    """A stream of 1-device jobs (sleep 0.5-2 s; every other one with a 3 s
    max runtime) keeps the 4 devices busy and 8 of them queued; a 4-device
    job arrives after 3 s. Returns (its wait in s, the wait its first
    reservation promised in s, the narrow jobs that started while it waited)."""
    c = Client(url, token)
    stop = threading.Event()
    started_narrow: list[int] = []

    def stream() -> None:
        sc = Client(url, token)
        i = 0
        while not stop.is_set():
            queued = len(sc.get("/v1/state")["queued"])
            if queued < 8:
                i += 1
                body = {
                    "command": ["sleep", f"{0.5 + (i % 4) * 0.5:g}"],
                    "selector": "*",
                    "max_runtime_seconds": 3 if i % 2 else 0,
                }
                started_narrow.append(sc.post("/v1/jobs", body)["job"]["id"])
            else:
                time.sleep(0.05)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    time.sleep(3.0)
    wide = c.post("/v1/jobs", {"command": ["true"], "selector": "*", "count": 4})["job"]
    submitted = wide["submitted_at"]
    promise = None
    deadline = time.monotonic() + seconds + 60
    while True:
        got = c.get(f"/v1/jobs/{wide['id']}")["job"]
        if got["state"] != "queued":
            break
        if promise is None:
            res = c.get(f"/v1/jobs/{wide['id']}/explain").get("reservation")
            if res and res.get("start_at"):
                promise = res["start_at"]
        if time.monotonic() > deadline:
            raise RuntimeError("timed out: the 4-device job never started")
        time.sleep(0.05)
    wait(
        lambda: c.get(f"/v1/jobs/{wide['id']}")["job"].get("started_at"),
        30,
        "the 4-device job's start",
        interval=0.02,
    )
    began = c.get(f"/v1/jobs/{wide['id']}")["job"]["started_at"]
    stop.set()
    t.join(10)
    overtook = sum(
        1
        for j in started_narrow
        if j > wide["id"] and (c.get(f"/v1/jobs/{j}")["job"].get("started_at") or 1e18) < began
    )
    for j in c.get("/v1/state")["queued"]:
        c.post(f"/v1/jobs/{j['id']}/kill", {})
    return began - submitted, (promise or float("nan")) - submitted, overtook


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--samples", type=int, default=100)
    args = p.parse_args()
    with fleet(4, worker_config=os.environ.get("RC_BENCH_WORKER_CONFIG", "")) as (
        url,
        _admin,
        token,
        tmp,
        _serve,
        _worker,
    ):
        lat = latency(url, token, tmp, args.samples)
        print(
            f"submit -> process started, {len(lat)} jobs, idle fleet: "
            f"median {statistics.median(lat) * 1e3:.1f} ms, p99 {percentile(lat, 99) * 1e3:.1f} ms"
            f"   (target: median <= 5 ms, p99 <= 15 ms; {PEERS['start']})"
        )
        before = requests_served(url, token)
        rate, submit_rate = throughput(url, token, args.jobs)
        after = requests_served(url, token)
        print(
            f"{args.jobs} short jobs end to end: {rate:.0f} jobs/s "
            f"(submissions alone: {submit_rate:.0f}/s)   (target >= 500 jobs/s; "
            f"{PEERS['throughput']})"
        )
        per = {side: (after[side] - before.get(side, 0.0)) / args.jobs for side in after}
        print(
            f"requests per job over those jobs: {sum(per.values()):.2f} (worker "
            f"{per.get('worker', 0):.2f}: the worker's /v1/workers/ routes; client "
            f"{per.get('client', 0):.2f}: every other route, i.e. the submit (1.00 a job), the "
            "bench's long poll watching the last job, and the worker's log uploads and "
            "faults)   (target <= 1.2)"
        )
        before, uploads = requests_served(url, token), log_uploads(url, token)
        rate, _ = throughput(url, token, args.jobs, command=("echo", "x"))
        after, uploads_after = requests_served(url, token), log_uploads(url, token)
        per = {side: (after[side] - before.get(side, 0.0)) / args.jobs for side in after}
        logs = (
            f"{(uploads_after - uploads) / args.jobs:.2f}"
            if uploads is not None and uploads_after is not None
            else "n/a (no rc_log_uploads_total)"
        )
        print(
            f"{args.jobs} `echo x` jobs end to end: {rate:.0f} jobs/s; requests per job "
            f"{sum(per.values()):.2f} (worker {per.get('worker', 0):.2f}, client "
            f"{per.get('client', 0):.2f}, of which log uploads {logs})   (beside the "
            "`true` jobs above: a line of output should cost no request)"
        )
        kills = kill_latency(url, token, tmp, 20)
        print(
            f"kill -> process gone, 20 kills: median {statistics.median(kills) * 1e3:.1f} ms, "
            f"max {max(kills) * 1e3:.1f} ms   (target <= 4 ms; {PEERS['kill']})"
        )
        waited, promised, overtook = wide_amid_narrow(url, token)
        print(
            f"a 4-device job amid a stream of 1-device jobs: waited {waited:.2f} s; its "
            f"reservation promised at most {promised:.2f} s; {overtook} later narrow jobs "
            "started before it (backfill)   (bound: waited <= promised)"
        )


if __name__ == "__main__":
    main()
