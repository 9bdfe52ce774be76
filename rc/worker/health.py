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

The parts, each in its own module: rc.worker.health_facts (nvidia-smi's
reading), rc.worker.kernlog (the kernel log's Xid events), rc.worker.health_rules
(the rule file and the judging); their parsers and judges are pure
functions. This module is the public face: `Monitor` keeps what one worker
process needs between passes, `job_note` says what the Xids on a job's GPUs
say about its end, and every public name of the parts is here too.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rc.proto.names import HEALTH_UNANSWERED
from rc.worker.health_facts import HEALTH_FIELDS, Query, parse_readings
from rc.worker.health_rules import (
    Finding,
    Rule,
    Rules,
    RulesError,
    XidRule,
    evaluate,
    label_status,
    load_rules,
    proof_status,
    xid_finding,
)
from rc.worker.kernlog import KERNEL_LOG_CAP, KernelLog, XidEvent, normal_pci, parse_kernel_log

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
    "xid_finding",
]

RECENT_XIDS = 256
"""Xid findings kept for matching to the jobs they hit."""


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


class Monitor:
    """Health passes for one worker process: the fields nvidia-smi accepts,
    the kernel log position, throttle streaks, the open episodes and the
    baseline. Not thread-safe (the prober serialises passes)."""

    def __init__(self, kernel_log: str, rules: Rules | None = None) -> None:
        self.rules = rules if rules is not None else load_rules()
        self.kernel = KernelLog(kernel_log)
        self.query = Query()
        self.streaks: dict[str, dict[str, int]] = {}
        self.open: dict[str, set[str]] = {}
        self.xid_faults: dict[str, list[Finding]] = {}
        self.baseline: dict[str, str] = {}
        self.pci: dict[str, str] = {}
        """normal_pci address → device name, from the last nvidia-smi reading."""
        self.recent: deque[Finding] = deque(maxlen=RECENT_XIDS)
        """The newest Xid findings, for the jobs they hit (job_note)."""

    @property
    def fields(self) -> tuple[str, ...]:
        """The --query-gpu fields this nvidia-smi accepts (HEALTH_FIELDS less
        those it refused)."""
        return self.query.fields

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

    def check(self, gpus: dict[str, int]) -> dict[str, str]:
        """Read `gpus` afresh (rc clear's and rc undrain's proof): device
        name → proof_status of the state facts alone ("unreadable" when
        nvidia-smi could not read the GPU). Episodes and streaks are left as
        they are; a GPU whose facts hold no fault sheds the Xid faults this
        process saw on it (the reset or reboot they needed is done: its
        label returns with them)."""
        readings = self.query.read()
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
        readings = self.query.read()
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
            status = label_status(findings + self.xid_faults.get(name, []), unknown)
            if readings is None and self.query.unanswered:
                status = HEALTH_UNANSWERED  # out of the pool until the driver answers
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
