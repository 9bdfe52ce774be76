#!/usr/bin/env python3
"""Relay benchmark (README "Performance").

Starts a controller and a worker (bench/fleet.py) on loopback, holds one
device, then prints:
1. `rc cp` of a 1 GB file of random bytes to the device and back, inside
   the hold: MB/s each way (wall time of the `rc cp` process, so it includes
   the CLI starting, the session starting and the remote tar), sha256 checked
   both ways; and the same upload through a short pipe job on the other
   device (no hold);
2. keystroke round trip: `rc shell HOLD -- cat` under a pseudo-terminal;
   one byte typed, the time until the far terminal's echo of it comes back
   (client → controller → worker → remote PTY and back); median and p99 of
   200;
3. `rc forward` into the hold, to a TCP server of this process on a
   loopback port: MB/s of one connection each way (--mb MiB, sha256
   checked), and connection setup: the time from connect() here to the
   first byte of the far server's answer (the session's start, both sides'
   relay halves, the worker's own connect), median and p99 of --conns.

Targets (README "Performance"): rc cp ≥ 150 MB/s, byte-exact; rc forward
≥ 100 MB/s, connection setup ≤ 10 ms median. Usage:
python bench/relay.py [--mb 1024] [--keys 200] [--conns 200]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import select
import socket
import socketserver
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from fleet import ROOT, fleet, percentile

from rc.worker.terminal import CTTY_SHIM


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def rc(env: dict, *args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "rc", *args], env=env, cwd=ROOT, check=True, timeout=600)
    return time.monotonic() - t0


def copies(env: dict, tmp: Path, hold: int, mb: int) -> None:
    src = tmp / "big.bin"
    with open(src, "wb") as f:
        f.writelines(os.urandom(1 << 20) for _ in range(mb))
    want = sha256(src)
    size = src.stat().st_size / 1e6
    (tmp / "remote").mkdir()  # rc cp creates no directory
    up = rc(env, "cp", "--hold", str(hold), str(src), f"bench:cpu0:{tmp}/remote/")
    assert sha256(tmp / "remote" / "big.bin") == want, "upload not byte-exact"
    (tmp / "remote-job").mkdir()
    job = rc(env, "cp", str(src), f"bench:cpu1:{tmp}/remote-job/")
    assert sha256(tmp / "remote-job" / "big.bin") == want, "job upload not byte-exact"
    (tmp / "back").mkdir()
    down = rc(
        env, "cp", "--hold", str(hold), f"bench:cpu0:{tmp}/remote/big.bin", str(tmp / "back") + "/"
    )
    assert sha256(tmp / "back" / "big.bin") == want, "download not byte-exact"
    print(f"rc cp {size:,.0f} MB up (inside a hold):   {size / up:7.1f} MB/s ({up:.2f} s)")
    print(f"rc cp {size:,.0f} MB up (a pipe job):      {size / job:7.1f} MB/s ({job:.2f} s)")
    print(f"rc cp {size:,.0f} MB down (inside a hold): {size / down:7.1f} MB/s ({down:.2f} s)")
    for p in (
        src,
        tmp / "remote" / "big.bin",
        tmp / "remote-job" / "big.bin",
        tmp / "back" / "big.bin",
    ):
        p.unlink()


def keystrokes(env: dict, hold: int, n: int) -> list[float]:
    master, slave = os.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CTTY_SHIM,
            sys.executable,
            "-m",
            "rc",
            "shell",
            str(hold),
            "--",
            "cat",
        ],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    buf = b""

    def until(marker: bytes, timeout: float = 30.0) -> None:
        nonlocal buf
        deadline = time.monotonic() + timeout
        while marker not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"no {marker!r} in {buf[-200:]!r}")
            if select.select([master], [], [], left)[0]:
                buf += os.read(master, 65536)
        buf = buf[buf.index(marker) + len(marker) :]

    try:
        os.write(master, b"ready\r")  # cat's own copy shows the session is up
        until(b"ready\r\nready")
        times = []
        for i in range(n):
            key = b"abcdefghijklmnopqrstuvwxyz"[i % 26 : i % 26 + 1]
            t0 = time.perf_counter()
            os.write(master, key)
            until(key)
            times.append(time.perf_counter() - t0)
        os.write(master, b"\r\x04")  # end of file: cat exits, so does the session
        proc.wait(30)
        return times
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        os.close(master)
        os.close(slave)


BLOCK = os.urandom(1 << 20)


class _Far(socketserver.BaseRequestHandler):
    """The forwarded server: b"S" + MiB count: sends that many BLOCKs;
    b"R": reads to end of file and answers the sha256 of what came;
    b"P": answers b"p" (connection setup)."""

    def handle(self) -> None:
        sock = self.request
        op = sock.recv(1)
        if op == b"S":
            n = int.from_bytes(sock.recv(4), "big")
            for _ in range(n):
                sock.sendall(BLOCK)
        elif op == b"R":
            h = hashlib.sha256()
            while data := sock.recv(1 << 20):
                h.update(data)
            sock.sendall(h.hexdigest().encode())
        elif op == b"P":
            sock.sendall(b"p")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def forwards(env: dict, hold: int, mb: int, conns: int) -> None:
    far = _Server(("127.0.0.1", 0), _Far)
    threading.Thread(target=far.serve_forever, daemon=True).start()
    port = far.server_address[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rc", "forward", str(hold), f"0:{port}"],
        env=env,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        line = proc.stderr.readline().decode()
        local = int(re.search(r"forwarding 127\.0\.0\.1:(\d+)", line).group(1))
        want = hashlib.sha256(BLOCK * mb).hexdigest()
        with socket.create_connection(("127.0.0.1", local)) as s:
            t0 = time.monotonic()
            s.sendall(b"S" + mb.to_bytes(4, "big"))
            h, got = hashlib.sha256(), 0
            while data := s.recv(1 << 20):
                h.update(data)
                got += len(data)
            down = time.monotonic() - t0
        assert got == mb << 20 and h.hexdigest() == want, "forward download not byte-exact"
        with socket.create_connection(("127.0.0.1", local)) as s:
            t0 = time.monotonic()
            s.sendall(b"R")
            for _ in range(mb):
                s.sendall(BLOCK)
            s.shutdown(socket.SHUT_WR)
            answer = b""
            while data := s.recv(100):
                answer += data
            up = time.monotonic() - t0
        assert answer.decode() == want, "forward upload not byte-exact"
        size = (mb << 20) / 1e6
        print(
            f"rc forward {size:,.0f} MB down, one connection: {size / down:7.1f} MB/s (target >= 100)"
        )
        print(
            f"rc forward {size:,.0f} MB up, one connection:   {size / up:7.1f} MB/s (target >= 100)"
        )
        ms = []
        for _ in range(conns):
            t0 = time.perf_counter()
            with socket.create_connection(("127.0.0.1", local)) as s:
                s.sendall(b"P")
                assert s.recv(1) == b"p"
                ms.append((time.perf_counter() - t0) * 1000)
        print(
            f"rc forward connection setup ({len(ms)}): median {statistics.median(ms):.2f} ms "
            f"(target <= 10), p99 {percentile(ms, 99):.2f} ms"
        )
    finally:
        proc.terminate()
        proc.wait(30)
        far.shutdown()
        far.server_close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the copied file in MiB")
    ap.add_argument("--keys", type=int, default=200, help="keystrokes timed")
    ap.add_argument("--conns", type=int, default=200, help="forward connections timed")
    ap.add_argument("--only-forward", action="store_true", help="rc forward's figures alone")
    args = ap.parse_args()
    with fleet(devices=2, worker_config='kill_grace = "1s"\n') as (url, _admin, token, tmp, *_):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
        env.update(
            RC_CONTROLLER=url,
            RC_TOKEN=token,
            PYTHONPATH=str(ROOT),
            TERM="xterm",
            HOME=str(tmp),
            XDG_CONFIG_HOME=str(tmp / ".config"),
        )
        hold = int(
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rc",
                    "hold",
                    "-d",
                    "bench:cpu0",
                    "--ttl",
                    "1h",
                    "--reason",
                    "bench",
                    "--detach",
                ],
                env=env,
                cwd=ROOT,
                check=True,
                capture_output=True,
            ).stdout
        )
        if not args.only_forward:
            copies(env, tmp, hold, args.mb)
            ms = [t * 1000 for t in keystrokes(env, hold, args.keys)]
            print(
                f"keystroke round trip ({len(ms)} keys): median {statistics.median(ms):.2f} ms, "
                f"p99 {percentile(ms, 99):.2f} ms"
            )
        forwards(env, hold, args.mb, args.conns)


if __name__ == "__main__":
    main()
