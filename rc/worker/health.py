"""What the driver says about each GPU's health (README "GPU health").

Each probe pass reads, per GPU, the facts of HEALTH_FIELDS from
`nvidia-smi --query-gpu=... --format=csv,noheader,nounits` and the NVIDIA
Xid events the kernel logged since the last pass (`/dev/kmsg` when it can be
read, else `dmesg`; the worker key `kernel_log` names the file), and judges
them by the rules of health_rules.json (NVIDIA's published Xid and ECC
guidance, each rule naming its source):

- fault: the device is quarantined with reason `fault` and the evidence;
- drain: the running job finishes, no new one starts;
- degraded: the label `health=degraded:<names>` (rc serve --drain-degraded
  drains it);
- app: the application's own error, recorded on the job only;
- baseline: recorded (`health_baseline`), no action.

A fact nvidia-smi cannot read ("[N/A]", "[Not Supported]", an error) is
unknown, never healthy: the label says `health=unknown:<names>`. The label is
`fault:<names>`, `drain:<names>`, `degraded:<names>`, `unknown:<names>` or
`ok`, the first that applies. Xid events logged before the worker's first
pass are its baseline, shown and not acted on (the state facts are read
afresh, so a card still broken is caught by them); an Xid fault stays on the
label for the life of the worker process (until rc clear's re-probe finds
the GPU readable and without a fault).

A drain is sent once per episode (when its fact appears, and again only if
it went away and came back); a fault of a state fact is sent on every pass
while the fact is there (`Pass.standing`; the controller ignores the one it
holds already), so a device cleared while its fault fact is present is
quarantined again by the next pass.

Parsers are pure functions over the text nvidia-smi and the kernel print;
`Monitor` keeps what one worker process needs between passes.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import subprocess
from collections import deque
from dataclasses import dataclass, field
from importlib import resources

from rc.worker import nvidia, reaper

__all__ = [
    "HEALTH_FIELDS",
    "KERNEL_LOG_CAP",
    "Finding",
    "JobNote",
    "KernelLog",
    "Monitor",
    "Pass",
    "Rule",
    "Rules",
    "RulesError",
    "XidEvent",
    "XidRule",
    "evaluate",
    "job_note",
    "load_rules",
    "normal_pci",
    "parse_kernel_log",
    "parse_readings",
    "proof_status",
]

log = logging.getLogger("rc.worker.health")

HEALTH_FIELDS = (
    "index",
    "pci.bus_id",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
    "clocks_throttle_reasons.hw_slowdown",
    "clocks_throttle_reasons.hw_thermal_slowdown",
    "clocks_throttle_reasons.hw_power_brake_slowdown",
    "pcie.link.gen.current",
    "pcie.link.gen.max",
    "pcie.link.width.current",
    "pcie.link.width.max",
    "temperature.gpu",
    "power.draw",
    "utilization.gpu",
)
"""The --query-gpu fields of a health pass, in this order."""
RECENT_XIDS = 256
"""Xid findings kept for matching to the jobs they hit."""
READ_BYTES = 16384
"""One read of the kernel log (a kmsg record is at most about 8 KiB)."""
KERNEL_LOG_CAP = 4 << 20
"""After the first read (the baseline, read whole), at most this many bytes
of the kernel log are read per pass; the rest waits for the next one."""
DMESG_TIMEOUT_S = 5.0
ACTIONS = ("fault", "drain", "degraded", "app", "baseline")
TESTS = ("nonzero", "yes", "below_max", "below_max_busy", "sustained")
_YES = {"yes", "active", "1", "true", "enabled", "pending"}
_NO = {"no", "not active", "0", "false", "disabled", "none"}
_INVALID_FIELD = re.compile(r'Field "([^"]+)" is not a valid field to query')


class RulesError(ValueError):
    """health_rules.json (or the text given) is not a valid rule file."""


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule on a fact: `test` of `field` (and `max_field`, or `or_field`
    when `field` is unknown) → `action`, because `why`, per `source`."""

    name: str
    field: str
    test: str
    action: str
    why: str
    source: str
    max_field: str = ""
    or_field: str = ""


@dataclass(frozen=True, slots=True)
class XidRule:
    """What an Xid event means: `action`, because `why`, per `source`."""

    xid: int
    action: str
    why: str
    source: str


@dataclass(frozen=True, slots=True)
class Rules:
    """The whole rule file. `busy_pct`: utilization.gpu (%) at or above which
    a GPU is busy; `sustained`: consecutive passes a throttle reason must be
    active to count."""

    facts: tuple[Rule, ...]
    xids: dict[int, XidRule]
    sources: dict[str, str]
    busy_pct: float = 10.0
    sustained: int = 3

    def source(self, key: str) -> str:
        """The source's full citation ("" for an unknown key)."""
        return self.sources.get(key, key)


def load_rules(text: str | None = None) -> Rules:
    """Parse a rule file (default: the health_rules.json shipped with rc).
    Raises RulesError naming the bad entry."""
    if text is None:
        text = resources.files("rc.worker").joinpath("health_rules.json").read_text("utf-8")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise RulesError(f"health rules are not JSON: {e}") from None
    sources = raw.get("sources", {})
    facts = []
    for i, r in enumerate(raw.get("facts", [])):
        try:
            rule = Rule(
                name=r["name"],
                field=r["field"],
                test=r["test"],
                action=r["action"],
                why=r["why"],
                source=r["source"],
                max_field=r.get("max_field", ""),
                or_field=r.get("or_field", ""),
            )
        except (KeyError, TypeError) as e:
            raise RulesError(f"fact rule {i}: missing {e}") from None
        if rule.test not in TESTS or rule.action not in ACTIONS or rule.source not in sources:
            raise RulesError(f"fact rule {rule.name!r}: bad test, action or source")
        if rule.test.startswith("below_max") and not rule.max_field:
            raise RulesError(f"fact rule {rule.name!r}: {rule.test} needs max_field")
        facts.append(rule)
    xids = {}
    for k, r in raw.get("xid", {}).items():
        if not k.isdigit() or r.get("action") not in ACTIONS or r.get("source") not in sources:
            raise RulesError(f"Xid rule {k!r}: bad number, action or source")
        xids[int(k)] = XidRule(int(k), r["action"], r.get("why", ""), r["source"])
    return Rules(
        tuple(facts),
        xids,
        dict(sources),
        float(raw.get("busy_utilization_pct", 10)),
        int(raw.get("sustained_passes", 3)),
    )


def parse_readings(text: str, fields: tuple[str, ...]) -> dict[int, dict[str, str | None]]:
    """Parse --query-gpu=FIELDS CSV (noheader, nounits): {GPU index: {field:
    value}}, a value nvidia-smi could not read being None. `fields` must
    start with "index"; a line with the wrong number of values is skipped."""
    out: dict[int, dict[str, str | None]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields) or not parts[0].isdigit():
            continue
        out[int(parts[0])] = {
            f: (p if p.lower() not in nvidia.UNAVAILABLE else None)
            for f, p in zip(fields, parts, strict=True)
        }
    return out


def normal_pci(bus_id: str) -> str:
    """A PCI address as "dddd:bb:dd" in lower case, from nvidia-smi's
    "00000000:3B:00.0" or the kernel's "0000:3b:00"; "" when it is neither."""
    m = re.fullmatch(
        r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?", bus_id.strip()
    )
    if m is None:
        return ""
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}:{m.group(3).lower()}"


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One NVRM Xid line of the kernel log: `key` orders events (the kmsg
    sequence number, or dmesg's timestamp), `at` is seconds since boot,
    `pci` the GPU's address (normal_pci), `xid` the number, `text` the line."""

    key: float
    at: float
    pci: str
    xid: int
    text: str


_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F:.]+)\): (\d+)")
_KMSG = re.compile(r"(\d+),(\d+),(\d+),[^;]*;(.*)")
_DMESG = re.compile(r"(?:<\d+>)?\[\s*(\d+\.\d+)\]\s?(.*)")


def parse_kernel_log(text: str) -> list[XidEvent]:
    """The Xid events of kernel log text: /dev/kmsg records
    ("PRI,SEQ,USEC,FLAGS;MESSAGE", continuation lines ignored) or dmesg
    lines ("[  SECONDS] MESSAGE"). Other lines are skipped."""
    out = []
    for line in text.splitlines():
        m = _KMSG.match(line)
        if m is not None:
            key, at, msg = float(m.group(2)), int(m.group(3)) / 1e6, m.group(4)
        else:
            d = _DMESG.match(line)
            if d is None:
                continue
            key = at = float(d.group(1))
            msg = d.group(2)
        x = _XID_LINE.search(msg)
        if x is None:
            continue
        out.append(XidEvent(key, at, normal_pci(x.group(1)), int(x.group(2)), msg.strip()))
    return out


class KernelLog:
    """Reads new Xid events from `path` (a kmsg-style device or file), else
    from `dmesg`. The first read is the baseline: its events are kept in
    `baseline` and not returned. `readable` is False while neither works."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.last: float | None = None
        self.baseline: list[XidEvent] = []
        self.readable = True
        self._warned = False
        self._fd: int | None = None
        self._partial = b""

    def _read_path(self) -> str:
        """What was logged since the last read: the file stays open, and a
        kmsg reader (or a file's offset) moves on from where it stopped, so
        nothing is read twice and a read of KERNEL_LOG_CAP bytes leaves the
        rest for the next one."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        chunks: list[bytes] = [self._partial]
        size = 0
        cap = KERNEL_LOG_CAP if self.last is not None else float("inf")  # the baseline: all
        while size < cap:
            try:
                b = os.read(self._fd, READ_BYTES)  # one kmsg record per read; a file in chunks
            except BlockingIOError:
                break  # kmsg: nothing more now
            except OSError as e:
                if e.errno == errno.EPIPE:  # kmsg: records overwritten under us
                    continue
                os.close(self._fd)
                self._fd = None
                raise
            if not b:
                break
            chunks.append(b)
            size += len(b)
        data = b"".join(chunks)
        end = data.rfind(b"\n") + 1  # a file's line cut by the cap: the rest comes next time
        self._partial = data[end:]
        return data[:end].decode("utf-8", "replace")

    def _read_dmesg(self) -> str:
        with reaper.spawning():
            proc = subprocess.Popen(
                ["dmesg"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            reaper.track(proc.pid)
        try:
            try:
                out, _ = proc.communicate(timeout=DMESG_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise OSError("dmesg did not answer") from None
        finally:
            reaper.untrack(proc.pid)
        if proc.returncode != 0:
            raise OSError(f"dmesg exited {proc.returncode}")
        return out[-KERNEL_LOG_CAP:].decode("utf-8", "replace")

    def read(self) -> list[XidEvent]:
        """The Xid events logged since the last read ([] on the first)."""
        try:
            text = self._read_path()
        except OSError as e:
            try:
                text = self._read_dmesg()
            except OSError as e2:
                if not self._warned:
                    log.warning(
                        "cannot read Xid events: %s: %s; dmesg: %s",
                        self.path,
                        e.strerror or e,
                        e2,
                    )
                    self._warned = True
                self.readable = False
                return []
        self.readable = True
        events = parse_kernel_log(text)
        if self.last is None:
            self.baseline = events[-32:]
            self.last = max((e.key for e in events), default=-1.0)
            return []
        new = [e for e in events if e.key > self.last]
        if new:
            self.last = max(e.key for e in new)
        return new


@dataclass(frozen=True, slots=True)
class Finding:
    """A rule that applies to a device now: `rule` ("xid-79", "pcie-width"),
    `action`, `why`, `evidence` (the values or the log line), `source` (its
    citation), and the Xid event behind it (None for a fact)."""

    device: str
    rule: str
    action: str
    why: str
    evidence: str
    source: str
    event: XidEvent | None = None

    def reason(self, device_id: str) -> str:
        """The quarantine or drain reason: names the rule, the evidence, the source."""
        return f"health: {self.rule} on {device_id}: {self.why} ({self.evidence}; source: {self.source})"


def _int(v: str | None) -> float | None:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


def _yes(v: str | None) -> bool | None:
    if v is None:
        return None
    w = v.strip().lower()
    return True if w in _YES else False if w in _NO else None


def evaluate(
    rules: Rules, device: str, reading: dict[str, str | None] | None, streak: dict[str, int]
) -> tuple[list[Finding], list[str]]:
    """Judge one GPU's reading: (findings, names of rules whose facts are
    unknown). `reading` None (nvidia-smi failed or did not list the GPU) makes
    every rule unknown. `streak` (rule name → consecutive active passes) is
    updated for the sustained rules."""
    findings: list[Finding] = []
    unknown: list[str] = []
    for r in rules.facts:
        if reading is None:
            unknown.append(r.name)
            continue
        v = reading.get(r.field)
        fld = r.field
        if v is None and r.or_field:
            fld, v = r.or_field, reading.get(r.or_field)
        hit: bool | None
        evidence = f"{fld}={v}"
        if r.test == "nonzero":
            n = _int(v)
            hit = None if n is None else n > 0
        elif r.test in ("yes", "sustained"):
            hit = _yes(v)
        else:
            cur, top = _int(v), _int(reading.get(r.max_field))
            evidence += f", {r.max_field}={reading.get(r.max_field)}"
            hit = None if cur is None or top is None else cur < top
            if hit and r.test == "below_max_busy":
                util = _int(reading.get("utilization.gpu"))
                evidence += f", utilization.gpu={reading.get('utilization.gpu')}"
                hit = None if util is None else util >= rules.busy_pct
        if r.test == "sustained":
            streak[r.name] = streak.get(r.name, 0) + 1 if hit else 0
            if hit:
                evidence += f" for {streak[r.name]} passes"
            hit = None if hit is None else streak[r.name] >= rules.sustained
        if hit is None:
            unknown.append(r.name)
        elif hit:
            findings.append(
                Finding(device, r.name, r.action, r.why, evidence, rules.source(r.source))
            )
    return findings, unknown


def xid_finding(rules: Rules, device: str, event: XidEvent) -> Finding:
    """What an Xid event on `device` means; an Xid the rules do not name is
    `app` (recorded on a job it hit, no action on the device)."""
    r = rules.xids.get(event.xid)
    if r is None:
        return Finding(
            device, f"xid-{event.xid}", "app", f"Xid {event.xid}", event.text, "no rule", event
        )
    return Finding(
        device,
        f"xid-{event.xid}",
        r.action,
        r.why,
        f"kernel: {event.text}",
        rules.source(r.source),
        event,
    )


@dataclass(slots=True)
class Pass:
    """One health pass: `labels` (device → {"health": ..., maybe
    "health_baseline": ...}), `actions` (fault and drain findings new in this
    pass: each is sent once per episode), `standing` (fault findings of state
    facts still there from an earlier pass: sent again, quietly, so a device
    cleared while its fault is there is quarantined again), `xids` (every
    new Xid finding, for the jobs they hit), `read` (whether nvidia-smi
    answered)."""

    labels: dict[str, dict[str, str]] = field(default_factory=dict)
    actions: list[Finding] = field(default_factory=list)
    standing: list[Finding] = field(default_factory=list)
    xids: list[Finding] = field(default_factory=list)
    read: bool = False


def _status(findings: list[Finding], unknown: list[str]) -> str:
    for action in ("fault", "drain", "degraded"):
        names = sorted({f.rule for f in findings if f.action == action})
        if names:
            return f"{action}:" + "+".join(names)
    if unknown:
        return "unknown:" + "+".join(sorted(set(unknown)))
    return "ok"


def proof_status(findings: list[Finding], unknown: list[str]) -> str:
    """Every kind of finding a GPU has, not only the first: "fault:<names>",
    "drain:<names>", "degraded:<names>", "unknown:<names>" in this order,
    those that apply joined by a space, else "ok" (what rc clear and rc
    undrain need: the rule that took the device out must be in none of them;
    its first part is the `health` label)."""
    parts = []
    for action in ("fault", "drain", "degraded"):
        names = sorted({f.rule for f in findings if f.action == action})
        if names:
            parts.append(f"{action}:" + "+".join(names))
    if unknown:
        parts.append("unknown:" + "+".join(sorted(set(unknown))))
    return " ".join(parts) or "ok"


class Monitor:
    """Health passes for one worker process: the fields nvidia-smi accepts,
    the kernel log position, throttle streaks, the open episodes and the
    baseline. Not thread-safe (the prober serialises passes)."""

    def __init__(self, kernel_log: str, rules: Rules | None = None) -> None:
        self.rules = rules if rules is not None else load_rules()
        self.kernel = KernelLog(kernel_log)
        self.fields = HEALTH_FIELDS
        self.streaks: dict[str, dict[str, int]] = {}
        self.open: dict[str, set[str]] = {}
        self.xid_faults: dict[str, list[Finding]] = {}
        self.baseline: dict[str, str] = {}
        self.pci: dict[str, str] = {}
        """normal_pci address → device name, from the last nvidia-smi reading."""
        self.recent: deque[Finding] = deque(maxlen=RECENT_XIDS)
        """The newest Xid findings, for the jobs they hit (job_note)."""

    def _xids(self) -> list[Finding]:
        """New Xid events of the kernel log on this worker's GPUs, judged."""
        out = []
        for ev in self.kernel.read():
            name = self.pci.get(ev.pci)
            if name is None:
                continue
            f = xid_finding(self.rules, name, ev)
            out.append(f)
            self.recent.append(f)
            if f.action == "fault":
                self.xid_faults.setdefault(name, []).append(f)
        return out

    def poll_xids(self) -> list[Finding]:
        """Read the kernel log now (a job just ended), between passes: the
        new Xid findings (also kept in `recent`). The next pass does not see
        them again, so the caller acts on their faults and drains."""
        return self._xids()

    def _query(self) -> dict[int, dict[str, str | None]] | None:
        """The readings, dropping fields this nvidia-smi does not know (they
        read unknown); None when nvidia-smi fails."""
        for _ in range(len(HEALTH_FIELDS)):
            try:
                out = nvidia._run(f"--query-gpu={','.join(self.fields)}", nvidia.TIMEOUT_S)
            except nvidia.NvidiaError as e:
                bad = _INVALID_FIELD.search(str(e))
                if bad is None or bad.group(1) not in self.fields or bad.group(1) == "index":
                    log.debug("health query failed: %s", e)
                    return None
                log.warning("nvidia-smi does not know %s; it reads unknown", bad.group(1))
                self.fields = tuple(f for f in self.fields if f != bad.group(1))
                continue
            return parse_readings(out, self.fields)
        return None

    def check(self, gpus: dict[str, int]) -> dict[str, str]:
        """Read `gpus` afresh (rc clear's and rc undrain's proof): device
        name → proof_status of the state facts alone ("unreadable" when
        nvidia-smi could not read the GPU). Episodes and streaks are left as
        they are; a GPU whose facts hold no fault sheds the Xid faults this
        process saw on it (the reset or reboot they needed is done: its
        label returns with them)."""
        readings = self._query()
        out = {}
        for name, index in gpus.items():
            r = readings.get(index) if readings is not None else None
            if r is None:
                out[name] = "unreadable"
                continue
            findings, unknown = evaluate(self.rules, name, r, dict(self.streaks.get(name, {})))
            out[name] = proof_status(findings, unknown)
            if not out[name].startswith("fault:"):
                self.xid_faults.pop(name, None)
        return out

    def run(self, gpus: dict[str, int]) -> Pass:
        """One pass over `gpus` (device name → GPU index)."""
        out = Pass()
        if not gpus:
            return out
        readings = self._query()
        out.read = readings is not None
        pci = {}
        for name, index in gpus.items():
            r = readings.get(index) if readings is not None else None
            if r is not None and r.get("pci.bus_id"):
                pci[normal_pci(r["pci.bus_id"] or "")] = name
        if readings is not None:
            self.pci = pci
        out.xids = self._xids()
        out.actions = [f for f in out.xids if f.action in ("fault", "drain")]
        for name, index in gpus.items():
            r = readings.get(index) if readings is not None else None
            findings, unknown = evaluate(self.rules, name, r, self.streaks.setdefault(name, {}))
            now_open = {f.rule for f in findings if f.action in ("fault", "drain")}
            for f in findings:
                if f.action in ("fault", "drain") and f.rule not in self.open.get(name, set()):
                    out.actions.append(f)
                elif f.action == "fault":
                    out.standing.append(f)
            self.open[name] = now_open
            status = _status(findings + self.xid_faults.get(name, []), unknown)
            labels = {"health": status}
            if name not in self.baseline and r is not None:
                self.baseline[name] = _baseline(status, r, self.kernel.baseline, pci, name)
            if name in self.baseline:
                labels["health_baseline"] = self.baseline[name]
            out.labels[name] = labels
        return out


@dataclass(frozen=True, slots=True)
class JobNote:
    """What the Xids on a job's GPUs say about its end (job_note).

    text: the words for its record, "" when no Xid hit it. hardware: the
    hardware cause ("Xid 79 on HOST:gpu3: GPU has fallen off the bus",
    several joined by "; "), "" when no fault or drain rule matched: then
    the failure is the job's own. faulty: the names of its devices a fault
    or drain rule matched on (the ones a requeue avoids)."""

    text: str = ""
    hardware: str = ""
    faulty: tuple[str, ...] = ()


def job_note(findings: list[Finding], host: str, device_names, since: float) -> JobNote:
    """What the Xid findings on a job's devices (`device_names`) logged at or
    after `since` (kernel seconds since boot) say about its end (a JobNote).
    Its text: "cause: hardware (Xid 79 on HOST:gpu3: GPU has fallen off the
    bus)" for a fault or drain rule, "Xid 13 on HOST:gpu0: graphics engine
    exception (the application's own)" for the others, joined by "; "; ""
    when none hit it."""
    names = set(device_names)
    hw, app, faulty = [], [], []
    for f in findings:
        if f.event is None or f.device not in names or f.event.at < since:
            continue
        what = f"Xid {f.event.xid} on {host}:{f.device}: {f.why}"
        if f.action in ("fault", "drain"):
            hw.append(what)
            faulty.append(f.device)
        else:
            app.append(what)
    parts = []
    hardware = "; ".join(dict.fromkeys(hw))
    if hw:
        parts.append(f"cause: hardware ({hardware})")
    parts += [f"{a} (the application's own)" for a in dict.fromkeys(app)]
    return JobNote("; ".join(parts), hardware, tuple(dict.fromkeys(faulty)))


def _baseline(
    status: str, r: dict[str, str | None], events: list[XidEvent], pci: dict[str, str], name: str
) -> str:
    """The first reading of a GPU in words: its status, lifetime uncorrected
    ECC errors, link, and the Xids it had logged before the worker started."""
    parts = [
        status,
        f"ecc_aggregate={r.get('ecc.errors.uncorrected.aggregate.total') or 'unknown'}",
    ]
    parts.append(
        f"pcie=gen{r.get('pcie.link.gen.current') or '?'}/{r.get('pcie.link.gen.max') or '?'}"
        f"x{r.get('pcie.link.width.current') or '?'}/{r.get('pcie.link.width.max') or '?'}"
    )
    xids = sorted({e.xid for e in events if pci.get(e.pci) == name})
    if xids:
        parts.append("xids_before=" + "+".join(map(str, xids)))
    return " ".join(parts)
