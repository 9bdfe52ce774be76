#!/usr/bin/env python3
"""Profile the controller and the worker under the dispatch bench's
throughput run (bench/dispatch.py figure 2) with py-spy.

py-spy (pip install py-spy; not a dependency of rc) samples both processes
from outside, every thread, while N `true` jobs go through; this prints, per
process, the functions with the most samples on CPU: `self` (the function
itself) and `total` (it and what it called), as the top of a profile.
Usage: python bench/pyspy.py [--jobs 1000] [--top 25] [--out DIR]
(writes DIR/controller-TAG.txt and DIR/worker-TAG.txt when --out is given,
and beside them the collapsed stacks, DIR/*-TAG.raw, for a flame graph).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from dispatch import throughput
from fleet import fleet


def summarise(raw: Path, top: int) -> str:
    """py-spy's raw (collapsed stack) output → the `top` functions by self
    and by total samples."""
    self_n: collections.Counter[str] = collections.Counter()
    total_n: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1] if " (" in f else f for f in frames]
        if frames:
            self_n[frames[-1]] += n
        for f in set(frames):
            total_n[f] += n
    out = [f"{samples} samples on CPU"]
    for title, c in (("self", self_n), ("total", total_n)):
        out.append(f"\ntop {top} by {title} samples:")
        for frame, n in c.most_common(top):
            out.append(f"{n:7d} {100 * n / max(1, samples):5.1f}%  {frame}")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", type=Path)
    p.add_argument("--tag", default="now")
    args = p.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        sys.exit("py-spy is not installed (pip install py-spy)")
    with fleet(4, worker_config=os.environ.get("RC_BENCH_WORKER_CONFIG", "")) as (
        url,
        _admin,
        token,
        tmp,
        serve,
        worker,
    ):
        throughput(url, token, 50)  # warm up
        spies = {}
        for name, proc in (("controller", serve), ("worker", worker)):
            raw = tmp / f"{name}.raw"
            spies[name] = (
                raw,
                subprocess.Popen(
                    [
                        spy,
                        "record",
                        "--pid",
                        str(proc.pid),
                        "--format",
                        "raw",
                        "-o",
                        str(raw),
                        "--rate",
                        "250",
                        "--nonblocking",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
            )
        time.sleep(1.0)  # py-spy attaches
        rate, _ = throughput(url, token, args.jobs)
        for _raw, sp in spies.values():
            sp.send_signal(2)
            sp.wait(30)
        print(f"{args.jobs} jobs: {rate:.0f} jobs/s under the profiler")
        for name, (raw, _sp) in spies.items():
            text = f"# {name}, {args.jobs} `true` jobs, {rate:.0f} jobs/s under py-spy\n"
            text += summarise(raw, args.top)
            print(text)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"{name}-{args.tag}.txt").write_text(text)
                shutil.copy(raw, args.out / f"{name}-{args.tag}.raw")


if __name__ == "__main__":
    main()
