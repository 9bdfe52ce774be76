"""What tests/e2e/test_leave.py and its fast-lane half
tests/store/test_leave.py share: their helpers and fixtures,
written once (the fixtures are imported by name, as fleet_users' are)."""

from __future__ import annotations

import contextlib
import socket

import pytest

from rc.controller.store import workers
from rc.proto.model import JobState, RecoveryProof
from rc.proto.wire import DeviceDecl, RegisterRequest
from tests.helpers.inprocess import Lab
from tests.helpers.proxy import Proxy


class Box(Lab):
    """The controller in-process with host `h` (one device, cpu0)."""

    def register(self, instance: str) -> None:
        req = RegisterRequest(
            host="h",
            devices=(DeviceDecl("cpu0"),),
            boot_id="boot-1",
            recovery=RecoveryProof(survivors_checked=True),
            instance=instance,
        )
        self.write(workers.register, req, self.ctl.match_cache, self.ctl.thresholds)

    def leave(self, instance: str, started=()):
        return self.write(workers.leave, "h", instance, tuple(started))

    def row(self, job_id: int):
        return self.read(lambda tx: tx.one("job_get", (job_id,)))

    def device(self) -> str:
        return self.read(lambda tx: tx.one("device_get", ("h:cpu0",)))["state"]

    def live_lease(self, job_id: int) -> bool:
        return any(r["job_id"] == job_id for r in self.read(lambda tx: tx.all("leases_live")))

    def lost(self) -> list[int]:
        rows = self.read(lambda tx: tx.all("events_since", (0, 0.0, 1000)))
        return [r["job_id"] for r in rows if r["kind"] == "job_lost"]


@pytest.fixture
def box(tmp_path):
    b = Box(tmp_path, startup_grace=0.0)
    b.register("first")
    yield b
    b.close()


def _behind_a_running_job(box: Box, **second) -> tuple[int, int, int]:
    """Job a runs on h:cpu0; b and c queue behind it; a ends, b is assigned
    (the worker never received it: it was stopping)."""
    a, _ = box.submit()
    box.now += 1
    b, _ = box.submit(command=("echo", "b"), **second)
    box.now += 1
    c, _ = box.submit(command=("echo", "c"))
    assert box.job(a).state is JobState.ASSIGNED
    box.finish(a, JobState.KILLED)
    assert box.job(b).state is JobState.ASSIGNED
    return a, b, c


class Tap(Proxy):
    """The partition test's proxy, keeping every byte it forwards."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.seen = b""
        super().__init__(target)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
