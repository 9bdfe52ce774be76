"""What tests/e2e/test_metrics.py and its fast-lane half
tests/unit/test_metrics.py share: their helpers, written once."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from rc.controller.config import ControllerConfig
from rc.controller.core import Controller as InProcessController


def parse(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, frozenset of label items): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


def run_in_process(tmp_path, body):
    """Start a controller on a real SQLite file in this process (no HTTP, no
    loops), run `await body(ctl)`, stop it."""

    async def main():
        ctl = InProcessController(ControllerConfig(data_dir=str(tmp_path / "data")))
        await ctl.start(loops=False)
        try:
            return await body(ctl)
        finally:
            await ctl.stop()

    return asyncio.run(main())


def scrape(url: str, token: str | None) -> tuple[int, str]:
    req = urllib.request.Request(url + "/metrics")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
