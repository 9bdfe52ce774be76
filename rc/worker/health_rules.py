"""The GPU health rules and how a reading is judged by them (README "GPU
health").

The rules are health_rules.json (NVIDIA's published Xid and ECC guidance,
each rule naming its source): a rule on a fact of nvidia-smi's reading
(rc.worker.health_facts), or on an Xid number (rc.worker.kernlog). Each
names its action:

- fault: the device is quarantined with reason `fault` and the evidence;
- drain: the running job finishes, no new one starts;
- degraded: the label `health=degraded:<names>` (rc serve --drain-degraded
  drains it);
- app: the application's own error, recorded on the job only;
- baseline: recorded (`health_baseline`), no action.

A fact nvidia-smi cannot read is unknown, never healthy. Judging is pure:
`evaluate` (a GPU's reading), `xid_finding` (an Xid event), `label_status` (the
label) and `proof_status` (what rc clear and rc undrain need).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from rc.worker.kernlog import XidEvent

__all__ = [
    "ACTIONS",
    "TESTS",
    "Finding",
    "Rule",
    "Rules",
    "RulesError",
    "XidRule",
    "evaluate",
    "label_status",
    "load_rules",
    "proof_status",
    "xid_finding",
]

ACTIONS = ("fault", "drain", "degraded", "app", "baseline")
TESTS = ("nonzero", "yes", "below_max", "below_max_busy", "sustained")
_YES = {"yes", "active", "1", "true", "enabled", "pending"}
_NO = {"no", "not active", "0", "false", "disabled", "none"}


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


def label_status(findings: list[Finding], unknown: list[str]) -> str:
    """The `health` label of a GPU with these findings and unknown facts:
    "fault:<names>", "drain:<names>", "degraded:<names>" or "unknown:<names>",
    the first that applies, else "ok"."""
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
