#!/usr/bin/env python3
"""Job array benchmarks (README "Arrays", "Performance").

Prints:
1. a 10,000-element array submitted in one request: the time from sending
   it to its durable acknowledgement (one transaction, every element queued,
   the scheduling pass that follows included) (target <= 1 s);
2. 1,000 `true` elements of one array end to end (from the submit to the
   last element's terminal state), against 1,000 single submits of `true`
   from 8 threads on the same fleet (target: the array at least as fast).

Loopback only, 4 CPU devices, a fresh controller and worker per figure.
Usage: python bench/arrays.py [--elements 10000] [--jobs 1000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import threading
import time

from fleet import fleet

from rc.proto.client import Client

TERMINAL = ("succeeded", "failed", "killed", "lost")


def _wait_done(c: Client, last: int, timeout: float = 600) -> None:
    """Long-poll job `last` (the newest: it ends about last, FIFO) to its
    end, then the whole queue and the active jobs to empty."""
    state, position = "", ""
    deadline = time.monotonic() + timeout
    while state not in TERMINAL:
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for the jobs to end")
        view = c.get(f"/v1/jobs/{last}?wait=30&state={state}&position={position}")
        state, position = view["job"]["state"], view["queue_position"]
    while True:
        st = c.get("/v1/state")
        if not st["jobs"] and not st["queued"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for the jobs to end")
        time.sleep(0.02)


def timed_array(c: Client, elements: int, target: dict) -> float:
    """Seconds from sending an array of `elements` `sleep 600` jobs (`target`:
    its selector or device) to its durable acknowledgement; checks that the
    controller then has every element."""
    body = {"command": ["sleep", "600"], "array": f"0-{elements - 1}", **target}
    t0 = time.monotonic()
    first = c.post("/v1/jobs", body)["job"]["id"]
    took = time.monotonic() - t0
    got = c.get("/v1/arrays/" + str(first))
    assert got["size"] == elements, got
    return took


def big_submit(elements: int) -> float:
    """timed_array on a fleet of 4 idle CPU devices (the pass that follows
    assigns 4 elements)."""
    with fleet(4) as (url, _admin, token, _tmp, _serve, _worker):
        return timed_array(Client(url, token), elements, {"selector": "*"})


def array_end_to_end(jobs: int) -> float:
    """jobs/s for `jobs` `true` elements of one array, submit to the last end."""
    with fleet(4) as (url, _admin, token, _tmp, _serve, _worker):
        c = Client(url, token)
        t0 = time.monotonic()
        first = c.post(
            "/v1/jobs", {"command": ["true"], "selector": "*", "array": f"0-{jobs - 1}"}
        )["job"]["id"]
        _wait_done(c, first + jobs - 1)
        return jobs / (time.monotonic() - t0)


def singles_end_to_end(jobs: int, threads: int = 8) -> float:
    """jobs/s for `jobs` single submits of `true` from `threads` threads."""
    with fleet(4) as (url, _admin, token, _tmp, _serve, _worker):
        local = threading.local()

        def submit(_) -> int:
            c = getattr(local, "c", None)
            if c is None:
                c = local.c = Client(url, token)
            return c.post("/v1/jobs", {"command": ["true"], "selector": "*"})["job"]["id"]

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as ex:
            last = max(ex.map(submit, range(jobs)))
        _wait_done(Client(url, token), last)
        return jobs / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=1000)
    args = ap.parse_args()
    took = big_submit(args.elements)
    print(
        f"an array of {args.elements} elements, one request, durable: acknowledged in "
        f"{took * 1e3:.0f} ms   (target <= 1 s; Slurm here: 59 jobs/s)"
    )
    arr = array_end_to_end(args.jobs)
    one = singles_end_to_end(args.jobs)
    print(
        f"{args.jobs} `true` jobs end to end: one array {arr:.0f} jobs/s, "
        f"{args.jobs} single submits (8 threads) {one:.0f} jobs/s   (target: array >= singles)"
    )


if __name__ == "__main__":
    main()
