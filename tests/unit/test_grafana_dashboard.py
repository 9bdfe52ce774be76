"""examples/grafana/rc.json (README "Grafana") queries only what a real
controller's GET /metrics serves: every metric name in its queries, and
every label they group or match by, exists in the exposition of a
controller on a real SQLite file (rendered in this process)."""

from __future__ import annotations

import asyncio
import json
import re

from prometheus_client.parser import text_string_to_metric_families

from rc.controller.config import ControllerConfig
from rc.controller.core import Controller as InProcessController
from tests.helpers.harness import REPO

DASHBOARD = REPO / "examples" / "grafana" / "rc.json"
METRIC = re.compile(r"\brc_[a-z0-9_]+\b")
BY = re.compile(r"\bby\s*\(([^)]*)\)")
MATCHER = re.compile(r"(rc_[a-z0-9_]+)\{([^}]*)\}")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def _exposition(tmp_path) -> str:
    async def main():
        ctl = InProcessController(ControllerConfig(data_dir=str(tmp_path / "data")))
        await ctl.start(loops=False)
        try:
            return (await ctl.metrics.render()).decode()
        finally:
            await ctl.stop()

    return asyncio.run(main())


def _served(text: str) -> dict[str, set[str] | None]:
    """Every series name served → the label names its samples carry (None
    when the family has no samples yet, such as a per-user counter on an
    empty store: its labels are then the README's table's)."""
    out: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        names = {family.name, *(family.name + s for s in SUFFIXES.get(family.type, ()))}
        for name in names:
            out.setdefault(name, None)
        for s in family.samples:
            have = out.get(s.name) or set()
            out[s.name] = have | set(s.labels)
            if s.name.endswith("_bucket"):  # `le` is the bucket's; the others share the rest
                for other in names:
                    out[other] = (out.get(other) or set()) | (set(s.labels) - {"le"})
    return out


def _queries(node) -> list[str]:
    if isinstance(node, dict):
        own = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return own + [q for v in node.values() for q in _queries(v)]
    if isinstance(node, list):
        return [q for v in node for q in _queries(v)]
    return []


README_LABELS = {"rc_device_seconds_total": {"user"}, "rc_worker_heartbeat_age_seconds": {"worker"}}
"""Labels of the series an empty store serves without samples (README "Dashboard and metrics")."""


def test_every_metric_the_dashboard_queries_exists(tmp_path):
    served = _served(_exposition(tmp_path))
    queries = _queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 10
    missing = sorted({m for q in queries for m in METRIC.findall(q)} - set(served))
    assert missing == [], f"queried but not served by /metrics: {missing}"
    bad = []
    for q in queries:
        used = {m: set() for m in METRIC.findall(q)}
        for name, matchers in MATCHER.findall(q):
            used[name] |= {m.split("=")[0].strip(" !~") for m in matchers.split(",") if m}
        grouped = {g.strip() for by in BY.findall(q) for g in by.split(",") if g.strip()}
        for name, labels in used.items():
            have = served[name] if served[name] is not None else README_LABELS.get(name, set())
            bad += [f"{name}{{{label}}} in {q!r}" for label in labels - have]
        every = set().union(*(served[n] or README_LABELS.get(n, set()) for n in used))
        bad += [f"by ({g}) in {q!r}" for g in grouped - every - {"le"}]
    assert bad == [], "labels the served series do not carry:\n" + "\n".join(bad)


def test_the_dashboard_is_one_importable_document():
    d = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["uid"] and d["title"]
    assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]
    for p in d["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["description"], p["title"]
