"""Shared pieces of the worker's end-to-end tests (no tests here): a
controller plus workers from the zipapp for a whole module, and job helpers
over the HTTP API."""

from __future__ import annotations

import socket
from pathlib import Path

from rc.proto.client import Client
from tests.helpers.fake_nvidia_smi import FakeNvidiaSmi
from tests.helpers.harness import Controller, Worker, base_env
from tests.helpers.wait import wait_until

TERMINAL = ("succeeded", "failed", "killed", "lost")


class Site:
    """One controller and the workers started against it, for one module."""

    def __init__(
        self,
        root: Path,
        pyz: Path,
        serve_flags: list[str] | None = None,
        listen: str = "127.0.0.1:0",
    ) -> None:
        self.root = root
        self.pyz = pyz
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        self.env = base_env(home)
        self.ctl = Controller(root / "data", self.env, serve_flags, listen=listen).start()
        self.admin = self.ctl.client(timeout=60)
        self.workers: list[Worker] = []

    def worker(
        self, host: str, config: str, devices: str = "", env: dict | None = None, wait: bool = True
    ) -> Worker:
        """Start a worker for `host` with the TOML `config` (its devices too,
        unless `devices` is given) and wait until its devices are ready."""
        cfg = self.root / f"{host}.toml"
        cfg.write_text(config)
        token = self.ctl.token(f"worker-{host}-{len(self.workers)}", "worker")
        w = Worker(
            self.ctl.url,
            token,
            self.root / "workers",
            env or self.env,
            host=host,
            devices=devices,
            pyz=self.pyz,
            config=cfg,
        ).start()
        self.workers.append(w)
        if wait:

            def ready() -> bool:
                if w.proc.poll() is not None:
                    raise AssertionError(f"worker exited {w.proc.returncode}:\n{w.log()}")
                views = self.admin.get("/v1/devices")["devices"]
                mine = [v for v in views if v["device"]["host"] == host]
                return bool(mine) and all(v["device"]["state"] == "ready" for v in mine)

            wait_until(ready, 30, f"worker {host} to register")
        return w

    def close(self) -> None:
        for w in self.workers:
            w.stop(timeout=30)
        self.ctl.stop()


def quiet_config(root, devices: str = "cpu:1", extra: str = "") -> str:
    """A worker.toml for these tests: a short kill grace, and verify, probe
    and sheet dirs under `root` that do not exist (nothing of the host's own);
    `extra` lines after it."""
    return (
        'kill_grace = "1s"\n'
        f'verify_dir = "{root}/no-verify"\n'
        f'probe_dir = "{root}/no-probes"\n'
        f'sheet_dir = "{root}/no-sheets"\n'
        f'devices = "{devices}"\n' + (extra + "\n" if extra else "")
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def submit(c: Client, command: list[str] | None = None, **fields) -> int:
    """Submit a job (any device unless device_id/selector given); its id."""
    body = {"selector": "*", **fields}
    if command is not None:
        body["command"] = command
    if "device_id" in body:
        body.pop("selector")
    return c.post("/v1/jobs", body)["job"]["id"]


def job(c: Client, job_id: int) -> dict:
    return c.get(f"/v1/jobs/{job_id}")["job"]


def wait_state(c: Client, job_id: int, states=TERMINAL, timeout: float = 30.0) -> dict:
    return wait_until(
        lambda: (j := job(c, job_id))["state"] in states and j,
        timeout,
        f"job {job_id} to reach {states}",
    )


def logs(c: Client, job_id: int) -> bytes:
    return c.request("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "0"}).body


def device(c: Client, device_id: str) -> dict:
    return c.get(f"/v1/devices/{device_id}/describe")["view"]["device"]


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(rest.split()[0])
    return out


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM (Linux: write 5 to clear_refs); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def read_pid(path: Path) -> int:
    return int(
        wait_until(
            lambda: path.exists() and path.read_text().strip(), 20, f"{path.name} to be written"
        )
    )


def gpu_site(root, pyz, host: str, gpus: int, serve_flags: tuple[str, ...] = ()) -> Site:
    """A controller and a worker from the zipapp on `host` with a fake
    nvidia-smi of `gpus` GPUs (`site.fake`) and a fake kmsg file as its
    kernel log (`site.kmsg`), probing every second."""
    s = Site(root, pyz, serve_flags=list(serve_flags))
    s.fake = FakeNvidiaSmi(root / "fakebin", gpus=gpus)
    s.kmsg = root / "kmsg"
    s.kmsg.write_text("6,1,1000,-;Linux version 6.1 (fake)\n")
    config = (
        'kill_grace = "1s"\n'
        'probe_interval = "1s"\n'
        f'kernel_log = "{s.kmsg}"\n'
        f'verify_dir = "{root}/no-verify"\n'
        f'probe_dir = "{root}/no-probes"\n'
        f'sheet_dir = "{root}/no-sheets"\n'
    )
    s.worker(host, config, devices="auto", env=s.fake.path_env(s.env))
    return s
