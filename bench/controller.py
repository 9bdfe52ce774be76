#!/usr/bin/env python3
"""Controller benchmarks for the other figures of README "Performance".

Prints, each against its target:
1. durable submissions from 8 concurrent client processes, one job per
   request (target ≥ 1,500/s; Slurm here 108/s, task-spooler 746/s not
   durable), and an array of 10,000 jobs in one request (target ≤ 1 s);
2. controller CPU while 1,000 devices heartbeat every 10 s (target ≤ 3 %),
   as 125 hosts × 8 devices and as 1,000 hosts × 1 device;
3. log ingestion, all jobs together, 1 MiB appends from 4 processes,
   each fdatasync'd before it is acknowledged (target ≥ 100 MB/s);
4. `rc devices` wall time, median of 20 (target ≤ 150 ms);
5. controller RSS with 1,000 devices and 100,000 jobs (target ≤ 300 MB);
6. an idle worker's RSS (target ≤ 40 MB);
7. `rc usage --since 30d` over 100,000 jobs (target ≤ 300 ms), and the
   scheduling pass with fair share on, 10,000 queued (target ≤ 20 ms).

Loopback only; fake workers are plain HTTP clients of the worker routes.
Usage: python bench/controller.py [--quick] [--only submits|heartbeats]
       [--database postgresql://...|pg]
(--only submits: figure 1 alone; --only heartbeats: the 1,000 hosts x 1
heartbeat figure alone; each measured exactly as in the full run.)

With --database each figure is measured on the embedded SQLite file and on
PostgreSQL, printed side by side ("sqlite: ... | postgresql: ..."): a
postgresql:// URL names a server (each figure empties the database it is
given: use a database of its own), `pg` starts a throwaway cluster
(tests/helpers/pgcluster.py, Debian's server binaries) with a fresh database per
figure. The controller's RSS is its own process's (the PostgreSQL server's
memory is not in it).
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

from arrays import timed_array
from fleet import ROOT, _wait_line, fleet

from rc.proto.client import Client


class Engine:
    """Where a figure's controller keeps its state: `name` "sqlite" or
    "postgresql"; `fresh()` gives the rc serve flags of an empty store for
    one figure; `direct(data)` a connection to write a history into it
    straight (sqlite3's API: execute, executemany with `?`, commit, close)."""

    def __init__(self, name: str, url: str = "") -> None:
        self.name = name
        self.url = url
        self.cluster = None
        self.dsn = ""
        self.current: tuple[str, ...] = ()

    def fresh(self) -> tuple[str, ...]:
        if self.name == "sqlite":
            return ()
        if self.url == "pg":
            if self.cluster is None:
                sys.path.insert(0, str(ROOT))
                from tests.helpers.pgcluster import PgCluster

                self.cluster = PgCluster(Path(tempfile.mkdtemp(prefix="rc-bench-pg-")) / "pg")
                self.cluster.start()
            self.dsn = self.cluster.create_database()
        else:
            self.dsn = self.url
            _empty(self.dsn)
        return ("--database", self.dsn)

    def direct(self, data: Path):
        if self.name == "sqlite":
            import sqlite3

            return sqlite3.connect(data / "rc.db")
        return _PgDirect(self.dsn)

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def _empty(dsn: str) -> None:
    """Drop rc's tables from a PostgreSQL database (a figure starts empty)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("DROP SCHEMA public CASCADE")
        c.execute("CREATE SCHEMA public")


class _PgDirect:
    """sqlite3's execute/executemany/commit/close on psycopg (`?` → `%s`);
    executemany also moves the id sequences past the ids written straight."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn)

    def execute(self, sql: str, params=()):
        return self.conn.execute(sql.replace("?", "%s"), params)

    def executemany(self, sql: str, rows) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), list(rows))
        for table in ("jobs", "leases"):  # past the ids written straight
            self.conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"coalesce((SELECT max(id) FROM {table}), 0) + 1, false)"
            )

    def commit(self) -> None:
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


ENGINE = Engine("sqlite")
"""The engine the figure being measured runs on (main sets it); its
`current` is the rc serve flags of the figure's store."""


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
            # no local socket: as root it would be /run/rc/rc.sock, which another run may hold
            "--socket",
            "",
            *ENGINE.current,
            *extra,
        ],
        pass_fds=(w,),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(data.parent / "serve.log", "ab"),  # noqa: SIM115 - the child keeps it
        cwd=ROOT,
    )
    os.close(w)
    url = _wait_line(r, proc, 30)
    os.close(r)
    proc.log_path = data.parent / "serve.log"
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
    if proc.poll() is not None and proc.returncode != 0:
        tail = proc.log_path.read_text(errors="replace")[-3000:]
        print(f"rc serve exited {proc.returncode} during the figure:\n{tail}", file=sys.stderr)
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


PROFILE: Path | None = None
"""With --profile DIR: where py-spy's summary of the controller during a
--only figure's measured part goes (DIR/TAG.txt; bench/pyspy.py summarises)."""


class _Profiled:
    """py-spy on the controller `proc` while the block runs, when --profile is given."""

    def __init__(self, proc, name: str) -> None:
        self.proc, self.name, self.spy = proc, name, None

    def __enter__(self):
        if PROFILE is None:
            return self
        import shutil

        spy = shutil.which("py-spy")
        if spy is None:
            sys.exit("py-spy is not installed (pip install py-spy)")
        PROFILE.mkdir(parents=True, exist_ok=True)
        self.raw = PROFILE / f"{self.name}.raw"
        self.spy = subprocess.Popen(
            [spy, "record", "--pid", str(self.proc.pid), "--format", "raw", "-o",
             str(self.raw), "--rate", "250", "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(1.0)  # py-spy attaches
        return self

    def __exit__(self, *exc) -> None:
        if self.spy is None:
            return
        self.spy.send_signal(2)
        self.spy.wait(30)
        from pyspy import summarise

        text = f"# controller, {self.name}\n" + summarise(self.raw, 25)
        (PROFILE / f"{self.name}.txt").write_text(text)  # the raw profile stays beside it


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


def _busy_device(url: str, admin: Client) -> str:
    """Register a fake worker `busy` with one device, held: every job
    submitted to busy:cpu0 is then a durable queued job. Returns a user
    token."""
    wtok = admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"]
    Client(url, wtok).post("/v1/workers/register", {"host": "busy", "devices": [{"name": "cpu0"}]})
    utok = admin.post("/v1/tokens", {"name": "u", "role": "user"})["secret"]
    Client(url, utok).post(
        "/v1/jobs",
        {"kind": "hold", "device_id": "busy:cpu0", "max_runtime_seconds": 3600, "reason": "bench"},
    )
    return utok


def submissions(total: int) -> str:
    ENGINE.current = ENGINE.fresh()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, admin = start_controller(Path(tmp) / "data")
        try:
            utok = _busy_device(url, admin)
            q = mp.Queue()
            procs = [
                mp.Process(target=_submitter, args=(url, utok, total // 8, q)) for _ in range(8)
            ]
            with _Profiled(proc, "submit"):
                elapsed = run_all(procs)
            return (
                f"durable submissions, 8 client processes: {total / elapsed:.0f}/s "
                f"({total} jobs, queue growing to {total})   (target >= 1,500/s; "
                "here: Slurm 108/s, task-spooler 746/s not durable)"
            )
        finally:
            stop(proc)


def array_submission(elements: int) -> str:
    """Figure 1b: one array of `elements` jobs in one request (queued behind
    a held device), from sending it to its durable acknowledgement."""
    ENGINE.current = ENGINE.fresh()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, admin = start_controller(Path(tmp) / "data")
        try:
            took = timed_array(
                Client(url, _busy_device(url, admin)), elements, {"device_id": "busy:cpu0"}
            )
            return (
                f"an array of {elements} jobs, one request, durable: acknowledged in "
                f"{took * 1e3:.0f} ms   (target <= 1 s; here: Slurm 59 jobs/s as an array)"
            )
        finally:
            stop(proc)


# -- 2. heartbeats -------------------------------------------------------------------


def heartbeats(hosts: int, per_host: int, seconds: float) -> str:
    ENGINE.current = ENGINE.fresh()
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
            with _Profiled(proc, "heartbeat"):
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            used = cpu_seconds(proc.pid) - start_cpu
            wall = time.monotonic() - t0
            return (
                f"{hosts * per_host} devices heartbeating every 10 s ({hosts} hosts x "
                f"{per_host}): controller CPU {used / wall * 100:.1f} % of one core   "
                "(target <= 3 %)"
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
    ENGINE.current = ENGINE.fresh()
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
                    "allow_root_jobs": True,  # the admin's jobs run as root when run as root
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
    ENGINE.current = ENGINE.fresh()
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
        db = ENGINE.direct(data)
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
    with fleet(8, ENGINE.fresh()) as (url, admin, token, tmp, _serve, worker):
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


class _Rollback(Exception):
    """Raised to roll a measured pass back, so the next one sees the same queue."""


def _history(db_path: Path, jobs: int, queued: int) -> None:
    """`jobs` finished jobs over the last 30 days (one in ten on 4 devices, one
    lease per device) and `queued` queued jobs of 20 users, straight into
    the database: a history to read, not a submission benchmark."""
    import random

    rnd = random.Random(7)
    db = ENGINE.direct(db_path.parent)
    now = time.time()
    span = 30 * 86400
    rows, leases = [], []
    for i in range(1, jobs + 1):
        start = now - rnd.random() * span
        length = rnd.choice((60, 600, 3600, 4 * 3600))
        host, count = i % 125, 4 if i % 10 == 0 else 1
        devices = [f"h{host}:gpu{(i + k) % 8}" for k in range(count)]
        user = f"user{i % 50}"
        rows.append((i, user, devices[0], f"h{host}", count, start - rnd.random() * 600,
                     start, start, min(now, start + length)))  # fmt: skip
        for d in devices:
            leases.append((d, i, user, start, start + length + 600, min(now, start + length)))
    db.executemany(
        "INSERT INTO jobs (id, kind, state, submitter, selector, device_id, worker_id, command, "
        "count, submitted_at, queued_at, assigned_at, started_at, finished_at, exit_code, "
        "unix_user, owner) "
        "VALUES (?, 'job', 'succeeded', ?, 'kind=gpu', ?, ?, '[\"true\"]', ?, ?, ?, ?, ?, ?, 0, "
        "?, 'name:' || ?)",
        ((r[0], r[1], r[2], r[3], r[4], r[5], r[5], r[6], r[7], r[8], r[1], r[1]) for r in rows),
    )
    db.executemany(
        "INSERT INTO leases (device_id, job_id, holder, kind, acquired_at, expires_at, "
        "released_at) VALUES (?, ?, ?, 'job', ?, ?, ?)",
        leases,
    )
    db.executemany(
        "INSERT INTO jobs (kind, state, submitter, selector, command, submitted_at, queued_at, "
        "unix_user, owner) "
        "VALUES ('job', 'queued', ?, 'kind=gpu', '[\"true\"]', ?, ?, ?, 'name:' || ?)",
        (
            (f"user{i % 20}", now - i, now - i, f"user{i % 20}", f"user{i % 20}")
            for i in range(queued)
        ),
    )
    db.commit()
    db.close()


def _rolled_up(data: Path, timeout: float = 600.0) -> float | None:
    """Wait until the controller rolled every finished job up (schema 15:
    no lease of a finished job left with rolled = 0); the seconds it took,
    or None for a tree from before the rollups (no such column)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        conn = ENGINE.direct(data)
        try:
            try:
                left = conn.execute(
                    "SELECT count(*) FROM leases AS l JOIN jobs AS j ON j.id = l.job_id "
                    "WHERE l.rolled = 0 AND j.finished_at IS NOT NULL"
                ).fetchone()[0]
            except Exception as e:  # sqlite3.OperationalError, psycopg's UndefinedColumn
                if "rolled" in str(e):
                    return None
                raise
        finally:
            conn.close()
        if not left:
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(f"the history was not rolled up in {timeout:.0f} s")


def ledger_and_fair_share(jobs: int, queued: int, runs: int = 7) -> list[str]:
    """The ledger's wall time and the scheduling pass with fair share on."""
    import asyncio

    from rc.controller.planning import Policy
    from rc.controller.store.labels import MatchCache
    from rc.controller.store.schedule import schedule
    from rc.controller.store.sqlite import SqliteDatabase
    from rc.controller.store.usage import ShareCache, compute_standings

    out = []
    ENGINE.current = ENGINE.fresh()
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
                        "labels": {f"gpu{i}": {"kind": "gpu"} for i in range(8)},
                    },
                )
        finally:
            stop(proc)
        _history(data / "rc.db", jobs, queued)
        proc, url, admin = start_controller(data, "--fair-share", "7d")
        try:
            rolled = _rolled_up(data)
            if rolled is not None:
                out.append(
                    f"rolled the history up into daily rollups in {rolled:.1f} s after start "
                    "(the controller's retention turn, in batches of 500 jobs)"
                )
            env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
            env.update(RC_CONTROLLER=url, RC_TOKEN=admin.token, PYTHONPATH=str(ROOT))
            walls, serves = [], []
            for _ in range(runs):
                t0 = time.monotonic()
                subprocess.run(
                    [sys.executable, "-m", "rc", "usage", "--since", "30d"],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                )
                walls.append(time.monotonic() - t0)
                t0 = time.monotonic()
                admin.get("/v1/usage", params={"since": "30d"})
                serves.append(time.monotonic() - t0)
            out.append(
                f"rc usage --since 30d over {jobs:,} jobs: "
                f"{statistics.median(walls) * 1000:.0f} ms median wall time "
                f"(GET /v1/usage {statistics.median(serves) * 1000:.0f} ms)   (target <= 300 ms)"
            )
        finally:
            stop(proc)

        async def passes() -> tuple[list[float], list[float]]:
            if ENGINE.name == "sqlite":
                db = await SqliteDatabase(str(data / "rc.db"), time.time).open()
            else:
                from rc.controller.store.pg import PgDatabase

                db = await PgDatabase(ENGINE.dsn, time.time).open()
            shares = ShareCache(7 * 86400.0)
            policy = Policy(aging=600.0, shares=shares)
            cache = MatchCache()
            timed, standings = [], []

            def one(tx):
                t0 = time.perf_counter()
                got = schedule(tx, cache, policy)
                timed.append(time.perf_counter() - t0)
                assert got, "the pass assigned nothing: no device was free"
                raise _Rollback

            def fresh(tx):
                t0 = time.perf_counter()
                compute_standings(tx, 7 * 86400.0)
                standings.append(time.perf_counter() - t0)

            try:
                for _ in range(runs):
                    try:
                        await db.write(one)
                    except _Rollback:
                        pass
                    await db.read(fresh)
            finally:
                await db.close()
            return timed, standings

        conn = ENGINE.direct(data)  # the controller stopped: make 8 devices free
        conn.execute("UPDATE devices SET state = 'ready', last_heartbeat_at = ?", (time.time(),))
        conn.execute(
            "UPDATE devices SET state = 'busy' WHERE id NOT IN (SELECT id FROM devices LIMIT 8)"
        )
        conn.commit()
        conn.close()
        timed, standings = asyncio.run(passes())
        out.append(
            f"scheduling pass, fair share on, {queued:,} queued, 8 free devices: "
            f"{statistics.median(timed[1:]) * 1000:.1f} ms median (the first, which sums the "
            f"decayed history: {timed[0] * 1000:.0f} ms; a recompute, once a minute at most: "
            f"{statistics.median(standings) * 1000:.0f} ms)   (target <= 20 ms)"
        )
    return out


def _on_engines(engines: list[Engine], figure) -> None:
    """Print figure()'s lines: as they are on one engine, side by side
    ("sqlite: ... | postgresql: ...") on two."""
    global ENGINE
    got = []
    for e in engines:
        ENGINE = e
        lines = figure()
        got.append([lines] if isinstance(lines, str) else lines)
    for row in zip(*got, strict=True):
        if len(engines) == 1:
            print(row[0], flush=True)
        else:
            print(" | ".join(f"{e.name}: {line}" for e, line in zip(engines, row)), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller runs")
    p.add_argument("--only-usage", action="store_true", help="only figure 7")
    p.add_argument(
        "--only",
        choices=("submits", "heartbeats"),
        help="only figure 1 (submits) or only the 1,000 hosts x 1 heartbeat figure",
    )
    p.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="with --only: py-spy on the controller during the figure, summary in DIR",
    )
    p.add_argument(
        "--database",
        default="",
        metavar="URL",
        help="also measure on PostgreSQL: a postgresql:// URL, or pg for a throwaway cluster",
    )
    args = p.parse_args()
    if (
        args.database
        and args.database != "pg"
        and not args.database.startswith(("postgresql://", "postgres://"))
    ):
        p.error("--database must be a postgresql:// URL or pg")
    engines = [Engine("sqlite")]
    if args.database:
        engines.append(Engine("postgresql", args.database))
    quick = args.quick
    global PROFILE
    PROFILE = args.profile
    try:
        if args.only == "submits":
            _on_engines(engines, lambda: submissions(800 if quick else 2000))
            return
        if args.only == "heartbeats":
            _on_engines(engines, lambda: heartbeats(1000, 1, 20 if quick else 40))
            return
        if not args.only_usage:
            _on_engines(engines, lambda: submissions(800 if quick else 2000))
            _on_engines(engines, lambda: array_submission(10_000))
            _on_engines(engines, lambda: heartbeats(125, 8, 20 if quick else 40))
            _on_engines(engines, lambda: heartbeats(1000, 1, 20 if quick else 40))
            _on_engines(engines, lambda: ingestion(64 if quick else 256))
            _on_engines(engines, lambda: memory_and_cli(20_000 if quick else 100_000))
        jobs = 20_000 if quick and not args.only_usage else 100_000
        _on_engines(engines, lambda: ledger_and_fair_share(jobs, 10_000))
    finally:
        for e in engines:
            e.close()


if __name__ == "__main__":
    main()
