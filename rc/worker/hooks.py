"""Lease lifecycle hooks: on_acquire before a job uses a
device, on_release once the device has been left alone for `release_linger`.

Each device has an in-memory "held" flag, an ownership epoch and at most one
pending release timer. Acquire cancels a pending release; if the device is
still held the hook is skipped, so a burst of back-to-back jobs gives exactly
one acquire and one release. A release is armed with the epoch of the acquire
it belongs to: if a later job acquired in between (a terminal report that was
slow to go out), the stale release is dropped and never fires during the next
job. A generation counter makes a timer that fires while being cancelled do
nothing. Hooks of one device run one at a time (a hook in flight delays the
next job on that device); devices are independent.

Hooks are executables run directly (never through a shell) with the job
supervision of rc.worker.script, `timeout` as their limit and the environment
RC_EVENT (acquire / release / verify), RC_DEVICE, RC_JOB_ID, RC_SUBMITTER (the
submitter's label: "alice", "alice (token laptop)") and the device's CUDA
variables. An on_acquire failure fails the job and faults the
device (rc.worker.job); an on_release failure is only logged, loudly.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

from rc.worker import script
from rc.worker.clock import SYSTEM, Clock, Timer
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.probe import device_env

__all__ = [
    "HOOK_OUTPUT_TAIL",
    "SHUTDOWN_DRAIN_S",
    "STARTUP_PASS_BUDGET_S",
    "Acquired",
    "DeviceHooks",
    "HookContext",
    "Leases",
    "hook_env",
]

log = logging.getLogger("rc.worker.hooks")

HOOK_OUTPUT_TAIL = 4096
"""Bytes of a failed hook's output quoted in the job's reason."""
STARTUP_PASS_BUDGET_S = 120.0
"""The startup release pass (every device's on_release) takes at most this."""
SHUTDOWN_DRAIN_S = 20.0
"""Pending lingering releases are fired at shutdown within this."""
LOCK_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class HookContext:
    """Who a hook runs for: the job id (None for the startup pass) and submitter."""

    job_id: int | None = None
    submitter: str = ""


@dataclass(frozen=True, slots=True)
class Acquired:
    """The outcome of an acquire: the ownership epoch to arm the release with,
    and, when it did not work, why (cancelled: our own kill or shutdown)."""

    epoch: int
    error: str = ""
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        """The device is the job's."""
        return not self.error


def hook_env(event: str, device_id: str, ctx: HookContext) -> dict[str, str]:
    """The environment of a hook or verify script: the worker's own minus its
    RC_* settings, then RC_EVENT, RC_DEVICE, RC_JOB_ID, RC_SUBMITTER (the submitter's label: "alice", "alice (token laptop)") and the
    device's CUDA variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
    env.update(
        {
            "RC_EVENT": event,
            "RC_DEVICE": device_id,
            "RC_JOB_ID": "" if ctx.job_id is None else str(ctx.job_id),
            "RC_SUBMITTER": ctx.submitter,
        }
    )
    for k, v in device_env(device_id.rpartition(":")[2]).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def _output_tail(res: script.ScriptResult) -> str:
    text = res.err.decode("utf-8", "replace").strip()
    return f"\n{text}" if text else ""


class DeviceHooks:
    """The hooks and lease state of one device. Thread-safe.

    `timeout` bounds each hook and `linger` delays a release (seconds of
    `clock`); `grace` is the kill grace of a hook that must be ended.
    """

    def __init__(
        self,
        device_id: str,
        dev: DeviceConfig,
        timeout: float,
        linger: float,
        grace: float,
        clock: Clock = SYSTEM,
    ) -> None:
        self.device_id = device_id
        self.dev = dev
        self.timeout = timeout
        self.linger = linger
        self.grace = grace
        self.clock = clock
        self._hook_lock = threading.Lock()
        self._state = threading.Lock()
        self.held = False
        self.epoch = 0
        self.generation = 0
        self._timer: Timer | None = None
        self._pending: HookContext | None = None
        self.acquires = 0
        self.releases = 0

    def _run(
        self,
        event: str,
        path: str,
        ctx: HookContext,
        cancel: threading.Event | None,
        timeout: float,
    ) -> script.ScriptResult:
        return script.run(
            [path],
            env=hook_env(event, self.device_id, ctx),
            timeout=timeout,
            grace=self.grace,
            cancel=cancel,
            merge=True,
            err_tail=HOOK_OUTPUT_TAIL,
            clock=self.clock,
        )

    def acquire(self, ctx: HookContext, cancel: threading.Event) -> Acquired:
        """Take the device for a job: cancel a pending release, run on_acquire
        unless the device is still held. Waits for a hook in flight on this
        device; `cancel` interrupts the wait and the hook."""
        while not self._hook_lock.acquire(timeout=LOCK_POLL_S):
            if cancel.is_set():
                return Acquired(
                    self.epoch, "cancelled while a hook of this device was running", cancelled=True
                )
        try:
            with self._state:
                self._cancel_pending()
                self.epoch += 1
                epoch = self.epoch
                if self.held:
                    return Acquired(epoch)
            if not self.dev.on_acquire:
                with self._state:
                    self.held = True
                return Acquired(epoch)
            self.acquires += 1
            res = self._run("acquire", self.dev.on_acquire, ctx, cancel, self.timeout)
            if res.cancelled:
                with self._state:
                    self.held = True  # half done: the release restores the device
                return Acquired(
                    epoch, f"cancelled during acquire hook: {self.dev.on_acquire}", cancelled=True
                )
            if not res.ok:
                return Acquired(
                    epoch,
                    f"acquire hook failed: {self.dev.on_acquire}: "
                    f"{res.describe()}{_output_tail(res)}",
                )
            with self._state:
                self.held = True
            return Acquired(epoch)
        finally:
            self._hook_lock.release()

    def _cancel_pending(self) -> None:
        self.generation += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending = None

    def arm_release(self, epoch: int, ctx: HookContext) -> bool:
        """After a job: release the device in `linger` seconds unless another job
        acquires it first. Dropped (False) when `epoch` is no longer the
        device's (a later job owns it) or the device is not held."""
        if not self.dev.on_acquire and not self.dev.on_release:
            return False  # nothing would run: no timer needed
        with self._state:
            if epoch != self.epoch:
                log.info(
                    "%s: release for job %s dropped: a later job owns the device",
                    self.device_id,
                    ctx.job_id,
                )
                return False
            if not self.held:
                return False
            self._cancel_pending()
            gen = self.generation
            self._pending = ctx
            self._timer = self.clock.timer(
                self.linger, lambda: self._fire(gen), f"rc-release-{self.dev.name}"
            )
            return True

    def pending(self) -> bool:
        """Whether a lingering release is armed."""
        with self._state:
            return self._pending is not None

    def _fire(self, gen: int, timeout: float | None = None) -> None:
        with self._hook_lock:
            with self._state:
                if gen != self.generation:
                    return  # a newer acquire or arm cancelled this release
                ctx = self._pending or HookContext()
                self._cancel_pending()
                self.held = False
            self._release(ctx, self.timeout if timeout is None else timeout)

    def _release(self, ctx: HookContext, timeout: float) -> bool:
        if not self.dev.on_release:
            return True
        self.releases += 1
        res = self._run("release", self.dev.on_release, ctx, None, timeout)
        if not res.ok:
            log.error(
                "%s: RELEASE HOOK FAILED: %s: %s%s (the device stays schedulable; "
                "the next worker start runs it again)",
                self.device_id,
                self.dev.on_release,
                res.describe(),
                _output_tail(res),
            )
        return res.ok

    def release_now(self, timeout: float) -> bool:
        """Run on_release now (startup pass, shutdown drain), cancelling a
        pending release. True when there was none or it worked."""
        with self._hook_lock:
            with self._state:
                ctx = self._pending or HookContext()
                self._cancel_pending()
                self.held = False
            return self._release(ctx, timeout)


class Leases:
    """The hooks of every device of one worker, on `clock`."""

    def __init__(self, cfg: WorkerConfig, clock: Clock = SYSTEM) -> None:
        self.cfg = cfg
        self.clock = clock
        self._devices: dict[str, DeviceHooks] = {}
        self._lock = threading.Lock()

    def configure(self, devices: list[DeviceConfig]) -> None:
        """Set the devices (at registration); existing state is kept."""
        with self._lock:
            for d in devices:
                if d.name not in self._devices or self._devices[d.name].dev != d:
                    self._devices[d.name] = DeviceHooks(
                        f"{self.cfg.host}:{d.name}",
                        d,
                        self.cfg.device_timeout(d),
                        self.cfg.device_linger(d),
                        self.cfg.kill_grace,
                        self.clock,
                    )

    def device(self, name: str) -> DeviceHooks | None:
        """The hooks of device `name` (None for a device not configured)."""
        with self._lock:
            return self._devices.get(name)

    def _all(self) -> list[DeviceHooks]:
        with self._lock:
            return list(self._devices.values())

    def startup_release_pass(self, budget: float = STARTUP_PASS_BUDGET_S) -> None:
        """Run every device's on_release once, one after another, within
        `budget` seconds (a previous worker may have died holding them).
        Failures are logged only; hooks must be idempotent."""
        deadline = self.clock.monotonic() + budget
        for h in self._all():
            if not h.dev.on_release:
                continue
            left = deadline - self.clock.monotonic()
            if left <= 0:
                log.error(
                    "startup release pass: out of time (%.0fs) before %s", budget, h.device_id
                )
                return
            h.release_now(min(h.timeout, left))

    def drain(self, budget: float = SHUTDOWN_DRAIN_S) -> None:
        """At shutdown: fire every pending lingering release now, within `budget`."""
        deadline = self.clock.monotonic() + budget
        for h in self._all():
            if not h.pending():
                continue
            left = deadline - self.clock.monotonic()
            if left <= 0:
                log.error("shutdown: no time left to release %s", h.device_id)
                return
            log.info("shutdown: releasing %s now instead of after its linger", h.device_id)
            h.release_now(min(h.timeout, left))
