#!/usr/bin/env python3
"""Fault injection with a history check (README "Loss bounds, measured
under faults"). Each scenario (tests/helpers/faults.py) starts a real controller
and worker on loopback, sends a stream of jobs, injects one fault, heals it
and audits what the jobs themselves recorded: acknowledged jobs lost, jobs
never ended, runs twice, busy devices handed out, log bytes lost, and the
time from the heal to the next start.

Usage: python bench/faults.py [--only partition-short,client-submit,...]
Prints a Markdown table (the README's) and exits 1 when a row is not clean.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.faults import SCENARIOS, table


def _zipapp(where: Path) -> Path:
    pyz = where / "rc.pyz"
    subprocess.run([sys.executable, str(ROOT / "zipapp"), "--output", str(pyz)], check=True)
    return pyz


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="comma list of scenarios (default: all)")
    args = p.parse_args()
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario {unknown[0]!r} (one of {', '.join(SCENARIOS)})")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rc-faults-") as tmp:
        pyz = _zipapp(Path(tmp))
        for name in names:
            root = Path(tmp) / name
            root.mkdir()
            print(f"running {name} ...", file=sys.stderr, flush=True)
            rows.append(SCENARIOS[name](root, pyz))
    print(table(rows))
    for r in rows:
        if r.note:
            print(f"- {r.scenario}: {r.note}")
    return 0 if all(r.clean() for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
