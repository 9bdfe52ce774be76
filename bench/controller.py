#!/usr/bin/env python3
"""Controller benchmarks for the other figures of README "Performance".

Prints, each against its target:
1. durable submissions from 8 concurrent client processes (target ≥ 2,000/s);
2. controller CPU while 1,000 devices heartbeat every 10 s (target ≤ 5 %),
   as 125 hosts × 8 devices and as 1,000 hosts × 1 device;
3. log ingestion, all jobs together, 1 MiB appends from 4 processes,
   each fdatasync'd before it is acknowledged (target ≥ 100 MB/s);
4. `rc devices` wall time, median of 20 (target ≤ 150 ms);
5. controller RSS with 1,000 devices and 100,000 jobs (target ≤ 300 MB);
6. an idle worker's RSS (target ≤ 40 MB).

Loopback only; fake workers are plain HTTP clients of the worker routes.
Usage: python bench/controller.py [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fleet import ROOT, _wait_line, fleet

from rc.proto.client import Client


def start_controller(data: Path, *extra: str):
    r, w = os.pipe()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rc",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(data),
            "--ready-fd",
            str(w),
            *extra,
        ],
        pass_fds=(w,),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    os.close(w)
    url = _wait_line(r, proc, 30)
    os.close(r)
    return proc, url, Client(url, (data / "admin.token").read_text().strip())


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def run_all(procs: list) -> float:
    """Start every process, wait for all of them; the seconds that took."""
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return time.monotonic() - t0


# -- 1. durable submissions --------------------------------------------------------


def _submitter(url: str, token: str, n: int, out) -> None:
    c = Client(url, token)
    t0 = time.monotonic()
    for _ in range(n):
        c.post("/v1/jobs", {"command": ["true"], "device_id": "busy:cpu0"})
    out.put(time.monotonic() - t0)


def submissions(total: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, admin = start_controller(Path(tmp) / "data")
        try:
            wtok = admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"]
            Client(url, wtok).post(
                "/v1/workers/register", {"host": "busy", "devices": [{"name": "cpu0"}]}
            )
            utok = admin.post("/v1/tokens", {"name": "u", "role": "user"})["secret"]
            # a hold keeps the device busy: every submission is a durable queued job
            Client(url, utok).post(
                "/v1/jobs",
                {
                    "kind": "hold",
                    "device_id": "busy:cpu0",
                    "max_runtime_seconds": 3600,
                    "reason": "bench",
                },
            )
            q = mp.Queue()
            procs = [
                mp.Process(target=_submitter, args=(url, utok, total // 8, q)) for _ in range(8)
            ]
            elapsed = run_all(procs)
            return (
                f"durable submissions, 8 client processes: {total / elapsed:.0f}/s "
                f"({total} jobs, queue growing to {total})   (target >= 2,000/s)"
            )
        finally:
            stop(proc)


# -- 2. heartbeats -------------------------------------------------------------------


def heartbeats(hosts: int, per_host: int, seconds: float) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, admin = start_controller(Path(tmp) / "data")
        try:
            clients = []
            for h in range(hosts):
                tok = admin.post("/v1/tokens", {"name": f"w{h}", "role": "worker"})["secret"]
                c = Client(url, tok)
                c.post(
                    "/v1/workers/register",
                    {
                        "host": f"h{h}",
                        "devices": [{"name": f"gpu{i}"} for i in range(per_host)],
                        "labels": {
                            f"gpu{i}": {"kind": "gpu", "model": "A100", "vram": "81920M"}
                            for i in range(per_host)
                        },
                    },
                )
                clients.append((f"h{h}", c))
            interval = 10.0
            stop_at = time.monotonic() + seconds
            start_cpu = cpu_seconds(proc.pid)
            t0 = time.monotonic()

            def beat(share):
                nxt = time.monotonic()
                while time.monotonic() < stop_at:
                    for host, c in share:
                        c.post(f"/v1/workers/{host}/heartbeat", {"running_job_ids": []})
                    nxt += interval
                    time.sleep(max(0.0, nxt - time.monotonic()))

            threads = [threading.Thread(target=beat, args=(clients[i::4],)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            used = cpu_seconds(proc.pid) - start_cpu
            wall = time.monotonic() - t0
            return (
                f"{hosts * per_host} devices heartbeating every 10 s ({hosts} hosts x "
                f"{per_host}): controller CPU {used / wall * 100:.1f} % of one core   "
                "(target <= 5 %)"
            )
        finally:
            stop(proc)


# -- 3. log ingestion ---------------------------------------------------------------------


def _appender(url: str, token: str, job_id: int, mib: int, out) -> None:
    c = Client(url, token)
    chunk = os.urandom(1 << 20)
    offset = 0
    for _ in range(mib):
        offset = c.request(
            "POST", f"/v1/jobs/{job_id}/logs", raw=chunk, params={"offset": offset}
        ).json()["size"]
    out.put(offset)


def ingestion(mib_each: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, admin = start_controller(Path(tmp) / "data", "--log-cap", str(1 << 30))
        try:
            wtok = admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"]
            w = Client(url, wtok)
            w.post(
                "/v1/workers/register",
                {
                    "host": "io",
                    "devices": [{"name": f"cpu{i}"} for i in range(4)],
                    "labels": {f"cpu{i}": {"kind": "cpu"} for i in range(4)},
                },
            )
            jobs = [
                admin.post("/v1/jobs", {"command": ["x"], "device_id": f"io:cpu{i}"})["job"]["id"]
                for i in range(4)
            ]
            q = mp.Queue()
            procs = [mp.Process(target=_appender, args=(url, wtok, j, mib_each, q)) for j in jobs]
            elapsed = run_all(procs)
            total = sum(q.get() for _ in procs) / (1 << 20)
            return (
                f"log ingestion, 4 jobs together, 1 MiB appends: {total / elapsed:.0f} MB/s "
                f"({total:.0f} MB)   (target >= 100 MB/s)"
            )
        finally:
            stop(proc)


# -- 4. rc devices, 5. memory, 6. worker -------------------------------------------------------


def cli_wall_time(url: str, token: str, n: int = 20) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    env.update(RC_CONTROLLER=url, RC_TOKEN=token, PYTHONPATH=str(ROOT))
    times = []
    for _ in range(n):
        t0 = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "rc", "devices"], env=env, check=True, stdout=subprocess.DEVNULL
        )
        times.append(time.monotonic() - t0)
    return statistics.median(times)


def memory_and_cli(jobs: int) -> list[str]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        proc, url, admin = start_controller(data)
        try:
            for h in range(125):
                tok = admin.post("/v1/tokens", {"name": f"w{h}", "role": "worker"})["secret"]
                Client(url, tok).post(
                    "/v1/workers/register",
                    {
                        "host": f"h{h}",
                        "devices": [{"name": f"gpu{i}"} for i in range(8)],
                        "labels": {
                            f"gpu{i}": {"kind": "gpu", "model": "H100", "vram": "81920M"}
                            for i in range(8)
                        },
                    },
                )
        finally:
            stop(proc)
        # the job history goes straight into the database (a 100,000-job history is
        # what the controller must carry, not a submission benchmark)
        import sqlite3

        db = sqlite3.connect(data / "rc.db")
        now = time.time()
        db.executemany(
            "INSERT INTO jobs (kind, state, submitter, selector, device_id, worker_id, command, "
            "submitted_at, queued_at, started_at, finished_at, exit_code) "
            "VALUES ('job', 'succeeded', ?, 'kind=gpu', ?, ?, '[\"python3\",\"train.py\"]', "
            "?, ?, ?, ?, 0)",
            (
                (
                    f"user{i % 50}",
                    f"h{i % 125}:gpu{i % 8}",
                    f"h{i % 125}",
                    now - i,
                    now - i,
                    now - i,
                    now - i + 60,
                )
                for i in range(jobs)
            ),
        )
        db.commit()
        db.close()
        proc, url, admin = start_controller(data)
        try:
            for path in (
                "/v1/devices",
                "/v1/state",
                "/v1/jobs?limit=1000",
                "/metrics",
                "/v1/events",
                "/v1/devices/h1:gpu1/describe",
            ):
                admin.request("GET", path)
            out.append(
                f"controller memory, 1,000 devices + {jobs:,} jobs: "
                f"{rss_mb(proc.pid):.0f} MB RSS   (target <= 300 MB)"
            )
            out.append(
                f"rc devices wall time with 1,000 devices: "
                f"{cli_wall_time(url, admin.token) * 1000:.0f} ms median   "
                "(target <= 150 ms)"
            )
        finally:
            stop(proc)
    with fleet(8) as (url, admin, token, tmp, _serve, worker):
        out.append(
            f"rc devices wall time with 8 devices: {cli_wall_time(url, token) * 1000:.0f}"
            " ms median   (target <= 150 ms)"
        )
        time.sleep(2)
        out.append(
            f"idle worker (python3 -I rc.pyz, 8 devices): {rss_mb(worker.pid):.1f} MB RSS"
            "   (target <= 40 MB)"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller runs")
    args = p.parse_args()
    print(submissions(800 if args.quick else 2000), flush=True)
    print(heartbeats(125, 8, 20 if args.quick else 40), flush=True)
    print(heartbeats(1000, 1, 20 if args.quick else 40), flush=True)
    print(ingestion(64 if args.quick else 256), flush=True)
    for line in memory_and_cli(20_000 if args.quick else 100_000):
        print(line, flush=True)


if __name__ == "__main__":
    main()
