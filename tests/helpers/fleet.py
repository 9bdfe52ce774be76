"""A controller, workers and CLIs for the relay's end-to-end tests (terminal jobs, holds, forwards): `running_fleet`, a hold helper and a pseudo-terminal CLI."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rc.worker.terminal import CTTY_SHIM
from tests.helpers.harness import PY, Cli, Controller, Worker, base_env
from tests.helpers.wait import wait_until

OUT_CTTY = (
    "import fcntl,os,sys,termios\n"
    "fcntl.ioctl(1,termios.TIOCSCTTY,0)\n"
    "os.execvp(sys.argv[1],sys.argv[1:])\n"
)
"""Make the terminal on stdout (not stdin) the controlling terminal, then exec."""


@dataclass
class Fleet:
    ctl: Controller
    worker: Worker
    alice: Cli
    bob: Cli
    tmp: Path


@contextlib.contextmanager
def running_fleet(
    tmp: Path, pyz: Path, listen: str = "127.0.0.1:0", extra: list[str] | None = None
) -> Iterator[Fleet]:
    """A controller (on `listen`; `extra`: more serve flags) and one worker
    (host "box", devices cpu0 and cpu1, a 1 s kill grace) from the zipapp,
    with users alice and bob."""
    home = tmp / "home"
    home.mkdir()
    env = base_env(home)
    ctl = Controller(tmp / "data", env, extra=extra, listen=listen).start()
    try:
        cfg = tmp / "worker.toml"
        cfg.write_text('kill_grace = "1s"\n')
        w = Worker(
            ctl.url,
            ctl.token("box-worker", "worker"),
            tmp / "worker",
            env,
            host="box",
            devices="cpu:2",
            pyz=pyz,
            config=cfg,
        ).start()
        try:
            c = ctl.client()
            wait_until(
                lambda: (
                    sum(v["device"]["state"] == "ready" for v in c.get("/v1/devices")["devices"])
                    == 2
                ),
                30,
                "the worker's two devices",
            )
            yield Fleet(
                ctl,
                w,
                Cli(ctl.url, ctl.token("alice"), env, tmp),
                Cli(ctl.url, ctl.token("bob"), env, tmp),
                tmp,
            )
        finally:
            w.stop()
    finally:
        ctl.stop()


def hold(cli: Cli, device: str) -> int:
    res = cli.run("hold", "-d", device, "--ttl", "10m", "--reason", "test", "--detach", check=True)
    return int(res.stdout)


class PtyCli:
    """`rc ARGS` with a pseudo-terminal as its controlling terminal; the test
    holds the other end (and the terminal itself, to check its modes)."""

    def __init__(
        self, cli: Cli, *args: str, rows: int = 24, cols: int = 80, out_only: bool = False
    ) -> None:
        """`out_only`: stdin from /dev/null, the terminal on stdout and stderr
        only (and still the controlling terminal, so SIGWINCH reaches rc)."""
        self.master, self.slave = os.openpty()
        self.resize(rows, cols)
        self.before = termios.tcgetattr(self.slave)
        self.proc = subprocess.Popen(
            [PY, "-c", OUT_CTTY if out_only else CTTY_SHIM, PY, "-m", "rc", *args],
            stdin=subprocess.DEVNULL if out_only else self.slave,
            stdout=self.slave,
            stderr=self.slave,
            env=cli.env,
            cwd=cli.cwd,
            start_new_session=True,
        )
        self.buf = b""
        self.seen = b""

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if ready:
            data = os.read(self.master, 65536)
            self.buf += data
            self.seen += data
        return bool(ready)

    def expect(self, pattern: bytes, timeout: float = 20.0) -> re.Match:
        """Wait for `pattern` (a regex) in the output not yet consumed."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.buf)
            if m:
                self.buf = self.buf[m.end() :]
                return m
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no {pattern!r} within {timeout}s; output: {self.seen[-800:]!r}"
                )
            self._read(min(left, 0.2))

    def wait(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"rc did not exit within {timeout}s: {self.seen[-800:]!r}")
            self._read(0.05)
        while self._read(0):
            pass
        return self.proc.returncode

    def restored(self) -> bool:
        return termios.tcgetattr(self.slave) == self.before

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        os.close(self.master)
        os.close(self.slave)


@pytest.fixture
def pty_cli():
    made: list[PtyCli] = []

    def make(cli: Cli, *args: str, **kw) -> PtyCli:
        t = PtyCli(cli, *args, **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


BASH = ("bash", "--norc", "--noprofile", "-i")
