"""Probe passes: the detected labels a worker reports.

Three sources: built-in facts (host-wide, plus kind=cpu on CPU devices),
nvidia-smi (one row per GPU → the device with that index: vendor, model, vram,
vram_free, driver, uuid), and drop-ins: every executable in `probe_dir`,
sorted by name, each printing exactly one JSON object. A drop-in key without a
dot is host-wide; "<device>.<key>" is that device's (declared devices only).
Later drop-ins override earlier ones; device facts override host-wide ones.

The preservation rule: a source that *fails* leaves the labels of the devices
it covers as they are (the device is left out of the payload, and the
controller keeps what it has), while a source that runs and reports nothing
clears them. nvidia-smi covers the devices it last reported, or every GPU-style
device if it never reported; it counts as failed when it errs, or when it is
missing now but was present when this worker started. A drop-in covers the
devices it named on its last success in this process ("all" if it gave
host-wide facts); one that never succeeded covers nothing. An unreadable
probe_dir fails every remembered drop-in; a missing one is simply empty.

GPU health (rc.worker.health) adds `health` and `health_baseline` to each
GPU device. A GPU device whose labels a failing nvidia-smi would keep is
sent again with the labels this process last sent for it and `health` set
to `unknown:nvidia-smi` (`fault:xid-N` for a GPU an Xid faulted: a fault
ranks before unknown): a pass that could not look never keeps a device
"healthy" (a device this process never sent is left out, as above).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field

from rc.proto.model import Link
from rc.proto.names import HEALTH_UNANSWERED
from rc.proto.selector import valid_label_key
from rc.proto.wire import DeviceLink
from rc.worker import health, nvidia, script
from rc.worker.clock import SYSTEM, Clock
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.probe import cuda_index, discover, host_facts, is_cpu_device

__all__ = [
    "LABELS_MAX",
    "LABEL_MAX_CHARS",
    "LINKED_GPUS_MAX",
    "PASS_BUDGET_S",
    "DropinError",
    "ProbeResult",
    "Prober",
    "parse_dropin",
]

log = logging.getLogger("rc.worker.probe")

PASS_BUDGET_S = 30.0
"""A whole probe pass; drop-ins it leaves no time for count as failed."""
DROPIN_OUT_CAP = 64 << 10
"""A drop-in's stdout over this is a failure."""
LABEL_MAX_CHARS = 1024
"""Longest label key or value the controller accepts; longer ones are dropped."""
LABELS_MAX = 256
"""Most labels per device the controller accepts; the rest are dropped."""
ALL = "*"
LINKED_GPUS_MAX = 64
"""A host reports the topology of at most this many GPUs (every pair of them:
the controller's links_per_worker); past it, none."""


def _natural(name: str) -> tuple[int, str]:
    return (int(cuda_index(name) or -1), name)


class DropinError(ValueError):
    """A drop-in's output is not exactly one JSON object."""


def _reject_constant(name: str):
    raise DropinError(f"{name} is not a JSON value")


def parse_dropin(
    data: bytes, devices: set[str]
) -> tuple[dict[str, str], dict[str, dict[str, str]], list[str]]:
    """Parse a drop-in's stdout: (host facts, {device: facts}, warnings).

    Strings are kept, numbers keep their text, booleans become "true" /
    "false", null is dropped; objects and arrays are dropped with a warning,
    as are keys naming an undeclared device or malformed. Raises DropinError
    unless the output is exactly one JSON object.
    """
    try:
        obj = json.loads(
            data.decode("utf-8"), parse_int=str, parse_float=str, parse_constant=_reject_constant
        )
    except UnicodeDecodeError:
        raise DropinError("output is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise DropinError(f"output is not one JSON object: {e.msg} at char {e.pos}") from None
    if not isinstance(obj, dict):
        raise DropinError(f"output is a JSON {type(obj).__name__}, not an object")
    host: dict[str, str] = {}
    per: dict[str, dict[str, str]] = {}
    warnings = []
    for key, value in obj.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif not isinstance(value, str):
            warnings.append(f"{key!r}: nested {type(value).__name__} dropped")
            continue
        dev, dot, sub = key.partition(".")
        if not dot:
            if key:
                host[key] = value
            else:
                warnings.append("an empty key was dropped")
        elif not dev or not sub:
            warnings.append(f"{key!r}: malformed key dropped")
        elif dev not in devices:
            warnings.append(f"{key!r}: no device {dev!r} on this worker; dropped")
        else:
            per.setdefault(dev, {})[sub] = value
    return host, per, warnings


def _bounded(facts: dict[str, str], where: str) -> dict[str, str]:
    """Drop labels the controller would refuse (over-long, too many, a name no
    selector could name)."""
    out = {}
    for k, v in facts.items():
        if not valid_label_key(k):
            log.warning(
                "%s: label %r dropped: a label name has no spaces and none of = ! < > ,",
                where,
                k[:40],
            )
        elif len(k) > LABEL_MAX_CHARS or len(v) > LABEL_MAX_CHARS:
            log.warning(
                "%s: label %r dropped: keys and values are at most %d characters",
                where,
                k[:40],
                LABEL_MAX_CHARS,
            )
        elif len(out) >= LABELS_MAX:
            log.warning("%s: more than %d labels; %r and later dropped", where, LABELS_MAX, k[:40])
            break
        else:
            out[k] = v
    return out


@dataclass(slots=True)
class ProbeResult:
    """One pass: the devices (as configured or discovered), the detected
    labels payload ("" → host-wide; a device left out keeps its stored labels;
    None says nothing at all), the sources that failed, with why, and the
    topology of the GPU devices (`links`, every pair of them; None says
    nothing: the stored topology is kept), and the GPU health pass
    (rc.worker.health: its labels are in `labels`, its faults and drains for
    the agent to send)."""

    devices: list[DeviceConfig]
    labels: dict[str, dict[str, str]] | None
    failed: dict[str, str] = field(default_factory=dict)
    links: tuple[DeviceLink, ...] | None = None
    health: health.Pass = field(default_factory=health.Pass)


class Prober:
    """Runs probe passes for one worker process and remembers what the
    preservation rule needs between passes. Thread-safe: a pass and the
    health reads between passes (`poll_xids`, `health_check`) take turns on
    one lock (the health monitor is not thread-safe). A pass takes at most
    `budget` seconds of `clock`."""

    def __init__(
        self, cfg: WorkerConfig, budget: float = PASS_BUDGET_S, clock: Clock = SYSTEM
    ) -> None:
        self.cfg = cfg
        self.budget = budget
        self.clock = clock
        self.nvidia_at_start = nvidia.available()
        self.nvidia_covered: set[str] | None = None
        self.dropin_covered: dict[str, set[str]] = {}
        self.failing: set[str] = set()
        self.skipped: set[str] = set()
        self.omitted: set[str] = set()
        self.uuids: dict[str, str] = {}
        """device name → its GPU's UUID, from the last nvidia-smi row seen."""
        self.topology_read = False
        """Whether `nvidia-smi topo -m` gave a topology in this process."""
        self.topology_failing = False
        self.fixed: dict[str, str] = {}
        """Host labels the worker itself sets (proctrack), winning over drop-ins."""
        self.health = health.Monitor(cfg.kernel_log)
        self.sent: dict[str, dict[str, str]] = {}
        """device name → the labels last sent for it (for a failed nvidia-smi:
        the same labels, with health unknown)."""
        self._lock = threading.Lock()

    def gpu_uuid(self, device_name: str) -> str:
        """The UUID of a device's GPU, as nvidia-smi last listed it ("" if never)."""
        return self.uuids.get(device_name, "")

    def poll_xids(self) -> tuple[list[health.Finding], list[health.Finding]]:
        """Read the kernel log now, between passes (health.Monitor.poll_xids):
        (the new Xid findings, the newest Xid findings kept, these among
        them)."""
        with self._lock:
            return self.health.poll_xids(), list(self.health.recent)

    def health_check(self, gpus: dict[str, int]) -> dict[str, str]:
        """Read the GPUs `gpus` (device name → index) afresh
        (health.Monitor.check): device name → proof status."""
        with self._lock:
            return self.health.check(gpus)

    def run(self, devices: list[DeviceConfig] | None = None) -> ProbeResult:
        """One pass. `devices` None: discover them from the config (and nvidia-smi)."""
        with self._lock:
            return self._run(devices)

    def _run(self, devices: list[DeviceConfig] | None) -> ProbeResult:
        deadline = self.clock.monotonic() + self.budget
        failed: dict[str, str] = {}
        hung = False  # nvidia-smi did not answer: no more of it this pass
        try:
            gpus: list[nvidia.GPU] | None = nvidia.query_gpus()
        except nvidia.NvidiaError as e:
            gpus = None
            hung = isinstance(e, nvidia.NvidiaTimeout)
            if self.nvidia_at_start or nvidia.available():
                failed["nvidia-smi"] = str(e)
        if devices is None:
            devices = discover(self.cfg.devices, gpus)
        names = [d.name for d in devices]
        host = host_facts()
        per: dict[str, dict[str, str]] = {
            n: ({"kind": "cpu"} if is_cpu_device(n) else {}) for n in names
        }
        omit: set[str] = set()
        gpu_names = {n for n in names if cuda_index(n) is not None}
        if gpus is not None:
            by_index = {str(g.index): g for g in gpus}
            covered = set()
            for n in gpu_names:
                g = by_index.get(cuda_index(n) or "")
                if g is not None:
                    per[n].update(g.labels())
                    covered.add(n)
                    if g.uuid:
                        self.uuids[n] = g.uuid
            self.nvidia_covered = covered
        elif "nvidia-smi" in failed:
            omit |= self.nvidia_covered if self.nvidia_covered is not None else gpu_names
        if hung:  # each query would wait its timeout again: the controller keeps the links
            links, checked = None, health.Pass()
        else:
            links = self._topology(sorted(gpu_names, key=_natural), per)
            checked = self.health.run(
                {n: int(cuda_index(n) or -1) for n in gpu_names} if nvidia.available() else {}
            )
        for n, facts in checked.labels.items():
            per[n].update(facts)
        self._dropins(set(names), host, per, omit, failed, deadline)
        self._note(failed, omit & set(names))
        if not host and not any(per.values()):
            return ProbeResult(devices, None, failed, links, checked)
        host.update(self.fixed)  # only with the rest: nothing read keeps what is stored
        labels = {"": _bounded(host, "host")}
        for n in names:
            if n not in omit:
                labels[n] = _bounded(per[n], n)
            elif "nvidia-smi" in failed and n in gpu_names and n in self.sent:
                # what it had, but never "healthy" on a pass that could not look;
                # an Xid fault stays (a fault ranks before unknown)
                # (a hung driver's GPUs: out of the pool until it answers)
                now = checked.labels.get(n, {}).get("health", "")
                unread = HEALTH_UNANSWERED if hung else "unknown:nvidia-smi"
                labels[n] = {
                    **self.sent[n],
                    "health": now if now.startswith("fault:") else unread,
                }
            if n in labels:
                self.sent[n] = labels[n]
        return ProbeResult(devices, labels, failed, links, checked)

    def _topology(
        self, gpu_names: list[str], per: dict[str, dict[str, str]]
    ) -> tuple[DeviceLink, ...] | None:
        """Every pair of the GPU devices with its link from `nvidia-smi topo -m`,
        and each one's NUMA node as the label `numa`. A pair the output does
        not give, and every pair when it cannot be read at all, is UNKNOWN,
        never an error; once it was read in this process, a failure says
        nothing (None: the controller keeps what it has)."""
        if len(gpu_names) < 2 or len(gpu_names) > LINKED_GPUS_MAX:
            return ()
        try:
            topo = nvidia.query_topology()
        except nvidia.NvidiaError as e:
            topo = nvidia.Topology()
            if not self.topology_failing:
                log.warning("nvidia-smi topo -m failed: %s (links count as unknown)", e)
        self.topology_failing = not topo.links
        if not topo.links and self.topology_read:
            return None
        self.topology_read = self.topology_read or bool(topo.links)
        index = {n: int(cuda_index(n) or -1) for n in gpu_names}
        for n, i in index.items():
            if topo.numa.get(i):
                per[n]["numa"] = topo.numa[i]
        out = []
        for x, a in enumerate(gpu_names):
            for b in gpu_names[x + 1 :]:
                i, j = sorted((index[a], index[b]))
                out.append(DeviceLink(a, b, topo.links.get((i, j), Link.UNKNOWN)))
        return tuple(out)

    def _dropins(
        self,
        names: set[str],
        host: dict[str, str],
        per: dict[str, dict[str, str]],
        omit: set[str],
        failed: dict[str, str],
        deadline: float,
    ) -> None:
        d = self.cfg.probe_dir
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except FileNotFoundError:
            entries = []
        except OSError as e:
            for name, cover in self.dropin_covered.items():
                failed[name] = f"cannot read {d}: {e.strerror or e}"
                omit |= names if ALL in cover else cover
            return
        seen = set()
        for entry in entries:
            path = entry.path
            try:
                if not entry.is_file():  # follows symlinks; directories are ignored
                    if entry.is_symlink() and not os.path.exists(path):
                        raise FileNotFoundError("dangling symlink")
                    continue
            except OSError as e:
                self._fail(entry.name, f"cannot stat: {e.strerror or e}", names, omit, failed)
                continue
            if not os.access(path, os.X_OK):
                if entry.name not in self.skipped:
                    log.warning("probe %s is not executable; skipped", path)
                    self.skipped.add(entry.name)
                continue
            self.skipped.discard(entry.name)
            seen.add(entry.name)
            left = deadline - self.clock.monotonic()
            if left <= 0:
                self._fail(entry.name, "the probe pass ran out of time", names, omit, failed)
                continue
            res = script.run(
                [path],
                env=self._env(sorted(names)),
                timeout=min(self.cfg.probe_timeout, left),
                grace=min(self.cfg.kill_grace, 2.0),
                out_cap=DROPIN_OUT_CAP,
                clock=self.clock,
            )
            if not res.ok:
                why = res.describe()
                tail = res.err.decode("utf-8", "replace").strip()[-200:]
                self._fail(entry.name, why + (f": {tail}" if tail else ""), names, omit, failed)
                continue
            if res.out_overflow:
                self._fail(
                    entry.name, f"printed more than {DROPIN_OUT_CAP} bytes", names, omit, failed
                )
                continue
            try:
                h, p, warnings = parse_dropin(res.out, names)
            except DropinError as e:
                self._fail(entry.name, str(e), names, omit, failed)
                continue
            for w in warnings:
                log.warning("probe %s: %s", entry.name, w)
            host.update(h)
            for dev, facts in p.items():
                per[dev].update(facts)
            self.dropin_covered[entry.name] = set(p) | ({ALL} if h else set())
        for gone in set(self.dropin_covered) - seen - set(failed):
            del self.dropin_covered[gone]  # removed from probe_dir: its facts clear

    def _fail(
        self, name: str, why: str, names: set[str], omit: set[str], failed: dict[str, str]
    ) -> None:
        failed[name] = why
        cover = self.dropin_covered.get(name, set())
        omit |= names if ALL in cover else cover

    def _env(self, names: list[str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RC_")}
        env.update({"RC_EVENT": "probe", "RC_HOST": self.cfg.host, "RC_DEVICES": ",".join(names)})
        return env

    def _note(self, failed: dict[str, str], omitted: set[str]) -> None:
        """Log failures and omissions once per episode."""
        for name, why in failed.items():
            if name not in self.failing:
                covers = (
                    "nothing yet, so the labels it gave clear"
                    if name != "nvidia-smi" and not self.dropin_covered.get(name)
                    else "its devices' labels are kept"
                )
                log.warning("probe %s failed: %s (%s)", name, why, covers)
        for name in self.failing - set(failed):
            log.info("probe %s works again", name)
        self.failing = set(failed)
        for dev in sorted(omitted - self.omitted):
            log.warning("labels of %s are kept as they were: a probe covering it failed", dev)
        self.omitted = omitted
