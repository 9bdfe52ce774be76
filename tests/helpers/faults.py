"""Fault scenarios with a history check (bench/faults.py prints their
table; tests/e2e/test_faults_e2e.py runs the bounded subset in CI).

Each scenario starts a real controller and worker, sends a stream of jobs,
injects one fault, heals it and waits until every job has ended. Every job
appends `ID RESTART DEVICE start|end TIME` lines to a marks file and prints
known lines, so the audit can say, from what the jobs themselves did:

- vanished: acknowledged submissions the controller no longer has;
- unfinished: jobs still not ended when the scenario's deadline passed;
- run twice: a (job, restart count) that started more than once;
- overlaps: a device on which a job's process started while another job's
  was still alive (a busy device handed out);
- log bytes lost: of the jobs that succeeded on their first run, output the
  controller's log is missing (or has extra);
- recover s: from the heal to the next job start.

Traffic stays on loopback (the proxy of tests/helpers/proxy.py cuts a
worker or a client off); nothing outside what a scenario made is touched.
"""

from __future__ import annotations

import collections
import itertools
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rc.proto.client import Client
from rc.proto.errors import RcError
from tests.helpers.fake_nvidia_smi import FakeNvidiaSmi
from tests.helpers.harness import PY, Controller, Worker, base_env
from tests.helpers.proxy import Proxy
from tests.helpers.wait import wait_until

LINES = 20
"""Lines each job prints (job ID line N)."""
TERMINAL = ("succeeded", "failed", "killed", "lost")


@dataclass
class Outcome:
    """One scenario's row of the table."""

    scenario: str
    engine: str = "sqlite"
    jobs: int = 0
    vanished: int = 0
    unfinished: int = 0
    run_twice: int = 0
    overlaps: int = 0
    log_bytes_lost: int = 0
    recover_s: float | None = None
    states: dict[str, int] = field(default_factory=dict)
    note: str = ""

    def clean(self) -> bool:
        """Nothing acknowledged lost, nothing run twice, no busy device handed out."""
        return (
            not (self.vanished or self.unfinished or self.run_twice or self.overlaps)
            and not self.log_bytes_lost
        )


def job_command(marks: Path, pause: float = 0.05) -> list[str]:
    """A job that marks its start and end and prints LINES known lines."""
    mark = f'echo "$RC_JOB_ID ${{RC_RESTART_COUNT:-0}} $RC_DEVICE KIND $(date +%s.%N)" >> {marks}'
    start, end = mark.replace("KIND", "start"), mark.replace("KIND", "end")
    body = (
        f"{start}; trap '{end}' EXIT; i=0; "
        f'while [ $i -lt {LINES} ]; do echo "job $RC_JOB_ID line $i"; i=$((i+1)); '
        f"sleep {pause}; done"
    )
    return ["sh", "-c", body]


def expected_log(job_id: int) -> bytes:
    return b"".join(f"job {job_id} line {i}\n".encode() for i in range(LINES))


def _marks(marks: Path) -> list[tuple[int, int, str, str, float]]:
    out = []
    if not marks.exists():
        return out
    for line in marks.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            out.append((int(parts[0]), int(parts[1]), parts[2], parts[3], float(parts[4])))
    return out


def audit(out: Outcome, admin: Client, ids: list[int], marks: Path, healed_at: float) -> Outcome:
    """Fill `out` from the controller's records and the jobs' marks."""
    out.jobs = len(ids)
    records = {}
    for i in ids:
        try:
            records[i] = admin.get(f"/v1/jobs/{i}")["job"]
        except RcError:
            out.vanished += 1
    out.states = dict(collections.Counter(j["state"] for j in records.values()))
    out.unfinished = sum(1 for j in records.values() if j["state"] not in TERMINAL)
    seen = _marks(marks)
    starts = collections.Counter((m[0], m[1]) for m in seen if m[3] == "start")
    out.run_twice = sum(1 for n in starts.values() if n > 1)
    # per device: [start, end] of each run; a run without an end mark (killed
    # hard) ends when the controller recorded the job's end
    ends = {(m[0], m[1]): m[4] for m in seen if m[3] == "end"}
    runs = collections.defaultdict(list)
    for jid, restart, device, kind, at in seen:
        if kind != "start":
            continue
        end = ends.get((jid, restart)) or (records.get(jid) or {}).get("finished_at") or time.time()
        runs[device].append((at, end, jid))
    for spans in runs.values():
        spans.sort()
        for (_, end_a, _), (start_b, _, _) in itertools.pairwise(spans):
            if start_b < end_a - 0.001:
                out.overlaps += 1
    for i, j in records.items():
        if j["state"] == "succeeded" and j.get("restart_count", 0) == 0 and starts[(i, 0)] == 1:
            got = _log(admin, i)
            out.log_bytes_lost += abs(len(expected_log(i)) - len(got))
            if got != expected_log(i) and len(got) == len(expected_log(i)):
                out.log_bytes_lost += len(got)
    later = [m[4] for m in seen if m[3] == "start" and m[4] >= healed_at]
    out.recover_s = (min(later) - healed_at) if later and healed_at else None
    return out


def _log(admin: Client, job_id: int) -> bytes:
    return b"".join(admin.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "0"}))


def _submit(c: Client, marks: Path, n: int, selector: str = "*") -> list[int]:
    return [
        c.post("/v1/jobs", {"command": job_command(marks), "selector": selector})["job"]["id"]
        for _ in range(n)
    ]


def _all_ended(admin: Client, ids: list[int]) -> bool:
    return all(admin.get(f"/v1/jobs/{i}")["job"]["state"] in TERMINAL for i in ids)


def _wait_ended(admin: Client, ids: list[int], timeout: float = 120.0) -> None:
    """Wait for every job to end; those that did not by `timeout` are the
    audit's `unfinished` (a row of the table, not a crash)."""
    try:
        wait_until(lambda: _all_ended(admin, ids), timeout, "every job to end")
    except AssertionError:
        pass


def _devices(admin: Client) -> str:
    return ", ".join(
        f"{v['device']['id']} {v['device']['state']}" for v in admin.get("/v1/devices")["devices"]
    )


FAST = ["--heartbeat-interval", "1s", "--unknown-after", "2s", "--sweep-interval", "0.2s"]


class Bed:
    """A controller, its admin client and workers, stopped by close()."""

    def __init__(self, root: Path, pyz: Path, serve_flags: list[str]) -> None:
        self.root, self.pyz = root, pyz
        self.env = base_env(root / "home")
        self.ctl = Controller(root / "data", self.env, serve_flags).start()
        self.admin = self.ctl.client()
        self.workers: list[Worker] = []
        self.closers: list[Callable[[], None]] = []
        self.marks = root / "marks"

    def worker(self, url: str | None = None, devices: str = "cpu:2", **kw) -> Worker:
        n = len(self.workers)
        w = Worker(
            url or self.ctl.url,
            self.ctl.token(f"w{n}", "worker"),
            self.root / f"w{n}",
            kw.pop("env", self.env),
            host=f"box{n}",
            devices=devices,
            pyz=self.pyz,
            **kw,
        ).start()
        self.workers.append(w)
        wait_until(lambda: f"registered box{n} " in w.log(), 30, f"worker box{n} to register")
        return w

    def close(self) -> None:
        for f in self.closers:
            f()
        for w in self.workers:
            w.stop()
        self.ctl.stop()


def _proxied(ctl: Controller) -> Proxy:
    host, port = ctl.url.rsplit("//", 1)[1].rsplit(":", 1)
    return Proxy((host, int(port)))


def worker_partition(root: Path, pyz: Path, pause_s: float, lost_after: str) -> Outcome:
    """The worker's link cut for `pause_s`, with the loss threshold `lost_after`."""
    name = f"worker partition {pause_s:g} s (lost after {lost_after})"
    bed = Bed(root, pyz, [*FAST, "--lost-after", lost_after])
    out = Outcome(name)
    try:
        proxy = _proxied(bed.ctl)
        bed.closers.append(proxy.close)
        bed.worker(f"http://127.0.0.1:{proxy.port}")
        ids = _submit(bed.admin, bed.marks, 12)
        wait_until(lambda: len(_marks(bed.marks)) >= 2, 60, "jobs to start")
        proxy.pause()
        t0 = time.monotonic()
        ids += _submit(bed.admin, bed.marks, 6)  # accepted while the worker is cut off
        wait_until(lambda: time.monotonic() - t0 >= pause_s, pause_s + 5, "the partition")
        proxy.resume()
        healed = time.time()
        _wait_ended(bed.admin, ids)
        return audit(out, bed.admin, ids, bed.marks, healed)
    finally:
        bed.close()


def client_submit_partition(root: Path, pyz: Path, rounds: int = 8) -> Outcome:
    """`rc run --detach` whose first reply is lost (the proxy cuts the
    connection once the controller answers): its retry, with the same
    idempotency key, must give the same job, never a second one."""
    bed = Bed(root, pyz, FAST)
    out = Outcome("client partition during submit")
    try:
        bed.worker()
        proxy = _proxied(bed.ctl)
        bed.closers.append(proxy.close)
        env = {**bed.env, "RC_CONTROLLER": f"http://127.0.0.1:{proxy.port}"}
        env["RC_TOKEN"] = bed.ctl.token("alice")
        ids = []
        for _ in range(rounds):
            proxy.drop_next_reply()
            res = subprocess.run(
                [PY, "-m", "rc", "run", "--detach", "--", *job_command(bed.marks)],
                env=env,
                capture_output=True,
                timeout=120,
                check=False,
            )
            if res.returncode != 0:
                out.note = res.stderr.decode(errors="replace").strip()[-200:]
                continue
            ids.append(int(res.stdout))
        healed = time.time()
        _wait_ended(bed.admin, ids)
        out = audit(out, bed.admin, ids, bed.marks, healed)
        made = bed.admin.get("/v1/jobs", params={"limit": 1000})["jobs"]
        out.run_twice += len(made) - len(set(ids))  # a submission that made two jobs
        out.jobs = rounds
        out.vanished += rounds - len(ids)
        out.recover_s = None
        if proxy.cut < rounds:  # the fault must have happened for the row to mean anything
            out.unfinished += rounds - proxy.cut
            out.note += f" only {proxy.cut} of {rounds} replies were cut"
        return out
    finally:
        bed.close()


def controller_kill9(root: Path, pyz: Path) -> Outcome:
    """kill -9 of the controller (SQLite) with jobs running and queued; a
    new `rc serve` on the same data directory and port."""
    bed = Bed(root, pyz, FAST)
    out = Outcome("controller kill -9 mid-stream")
    try:
        bed.worker()
        ids = _submit(bed.admin, bed.marks, 16)
        wait_until(lambda: len(_marks(bed.marks)) >= 4, 60, "jobs to start")
        port = bed.ctl.url.rsplit(":", 1)[1]
        bed.ctl.kill9()
        bed.ctl.listen = f"127.0.0.1:{port}"
        bed.ctl.start()
        healed = time.time()
        bed.admin = bed.ctl.client()
        _wait_ended(bed.admin, ids)
        return audit(out, bed.admin, ids, bed.marks, healed)
    finally:
        bed.close()


def nvidia_smi_hang(root: Path, pyz: Path, hang_s: float = 12.0) -> Outcome:
    """nvidia-smi stops answering (a fake that sleeps) on a GPU worker: no
    job may start on its GPUs meanwhile, the worker keeps answering (its CPU
    device still runs jobs), and the GPUs come back when it answers again."""
    bed = Bed(root, pyz, FAST)
    out = Outcome(f"nvidia-smi hangs {hang_s:g} s")
    try:
        fake = FakeNvidiaSmi(root / "fakebin", gpus=2)
        cfg = root / "gpu.toml"
        cfg.write_text(
            'probe_interval = "1s"\n[[devices]]\nname = "gpu0"\n[[devices]]\nname = "gpu1"\n'
        )
        bed.worker(devices="", config=cfg, env=fake.path_env(bed.env))
        bed.worker(devices="cpu:1")
        gpu_jobs = _submit(bed.admin, bed.marks, 2, "host=box0")
        wait_until(lambda: _all_ended(bed.admin, gpu_jobs), 60, "the first GPU jobs")
        fake.mode("hang")
        t0 = time.monotonic()
        hung_at = time.time()
        wait_until(lambda: time.monotonic() - t0 >= 6, 10, "the hang to be noticed")
        during = _submit(bed.admin, bed.marks, 4, "host=box0") + _submit(
            bed.admin, bed.marks, 4, "host=box1"
        )
        wait_until(lambda: time.monotonic() - t0 >= hang_s, hang_s + 5, "the hang")
        fake.mode("healthy")
        healed = time.time()
        ids = gpu_jobs + during
        _wait_ended(bed.admin, ids)
        out = audit(out, bed.admin, ids, bed.marks, healed)
        if out.unfinished:
            out.note += f" devices after the heal: {_devices(bed.admin)}"
        started_hung = [
            m for m in _marks(bed.marks) if m[3] == "start" and hung_at + 6 < m[4] < healed
        ]
        on_gpu = [m for m in started_hung if m[2].startswith("box0:")]
        if on_gpu:
            out.overlaps += len(on_gpu)  # a job handed to a GPU whose driver hangs
            out.note += f" {len(on_gpu)} job(s) started on a hung GPU"
        if not [m for m in started_hung if m[2].startswith("box1:")]:
            out.note += " the CPU worker ran nothing while the GPU one hung"
        return out
    finally:
        for w in bed.workers:
            _kill_tree(w)
        bed.close()


def _kill_tree(w: Worker) -> None:
    """Nothing a hung fake nvidia-smi started outlives the scenario."""
    subprocess.run(["pkill", "-f", str(w.workdir.parent / "fakebin")], check=False)


SCENARIOS: dict[str, Callable[[Path, Path], Outcome]] = {
    "partition-short": lambda root, pyz: worker_partition(root, pyz, 4.0, "30s"),
    "partition-long": lambda root, pyz: worker_partition(root, pyz, 6.0, "3s"),
    "client-submit": client_submit_partition,
    "controller-kill9": controller_kill9,
    "nvidia-smi-hang": nvidia_smi_hang,
}
"""Every scenario by name; CI runs CI_SCENARIOS, bench/faults.py all."""
CI_SCENARIOS = ("partition-short", "client-submit", "controller-kill9", "nvidia-smi-hang")


def table(rows: list[Outcome]) -> str:
    """The published table (README "Loss bounds, measured under faults")."""
    head = ("scenario", "engine", "jobs", "lost", "unended", "twice", "busy handed out",
            "log bytes lost", "recover s")  # fmt: skip
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        rec = "-" if r.recover_s is None else f"{r.recover_s:.1f}"
        lines.append(
            " | ".join(
                str(x)
                for x in (
                    r.scenario,
                    r.engine,
                    r.jobs,
                    r.vanished,
                    r.unfinished,
                    r.run_twice,
                    r.overlaps,
                    r.log_bytes_lost,
                    rec,
                )
            )
        )
    return "\n".join(f"| {line} |" for line in lines)


__all__ = ["CI_SCENARIOS", "SCENARIOS", "Outcome", "audit", "table"]
