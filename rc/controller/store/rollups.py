"""The ledger's daily rollups, and history that ends (schema 15; README
"History that ends").

A finished job's leases are rolled up into `usage_days`: one row per UTC day,
lease holder (the Unix user), host, kind and final state, holding that day's
device-seconds and idle hold seconds, and a histogram of the waits of the
jobs granted devices that day (`bucket` below). A job is counted once per
key of each view of the ledger, on one row:
- n_user: on the last day it held a device (by user, and the total);
- n_host: per host, on the last day it held a device of that host;
- n_day: on every day it held a device;
- n_week: per week (from Monday, UTC), on the last day of it it held a device.
So a window that covers whole days adds rows up and counts each job as the
lease history would. The ledger (rc.controller.store.ledger) reads the
rollups of the window's whole days, the leases of its first, partial day
(while they are kept) and the leases not rolled up yet.

`roll_up` and `expire` are transaction functions of a bounded batch each
(ROLL_BATCH_JOBS, EXPIRE_BATCH_JOBS jobs): never one huge transaction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from rc.controller.store.db import Tx, dumps, loads

__all__ = [
    "BUCKETS_PER_DOUBLING",
    "DAY_S",
    "EXPIRE_BATCH_JOBS",
    "ROLL_BATCH_JOBS",
    "Acc",
    "LeaseRow",
    "add_job",
    "add_wait",
    "bucket",
    "bucket_value",
    "day_of",
    "expire",
    "log_owners",
    "roll_up",
    "week_of",
]

DAY_S = 86400.0
ROLL_BATCH_JOBS = 500
"""Most finished jobs rolled up in one transaction."""
EXPIRE_BATCH_JOBS = 500
"""Most jobs (and as many events) deleted in one transaction."""
BUCKETS_PER_DOUBLING = 8
"""Wait histogram resolution: a rolled-up wait is known to within 2^(1/8),
9 % (bucket)."""

Key = tuple[float, str, str, str, str]
"""A rollup row's key: (day, holder, host, kind, state)."""


def day_of(t: float) -> float:
    """The UTC midnight at or before `t` (seconds since the epoch)."""
    return math.floor(t / DAY_S) * DAY_S


def week_of(day: float) -> float:
    """The Monday (UTC midnight) of the week of `day`; the epoch was a Thursday."""
    return math.floor((day + 3 * DAY_S) / (7 * DAY_S)) * 7 * DAY_S - 3 * DAY_S


def bucket(wait: float) -> int:
    """The histogram bucket of a wait in seconds: -1 for none (0 s), 0 for up
    to 1 ms, else b with 2^((b-1)/8) < wait/1 ms <= 2^(b/8)."""
    if wait <= 0:
        return -1
    return max(0, math.ceil(BUCKETS_PER_DOUBLING * math.log2(wait * 1000.0) - 1e-9))


def bucket_value(b: int) -> float:
    """The wait a bucket stands for, seconds: its upper edge (0 for -1)."""
    return 0.0 if b < 0 else 2.0 ** (b / BUCKETS_PER_DOUBLING) / 1000.0


@dataclass
class Acc:
    """One row's sums: device-seconds, idle hold seconds, job counts per view,
    waits as a histogram (bucket → count) and as exact values (leases not
    rolled up)."""

    seconds: float = 0.0
    idle: float = 0.0
    n_user: int = 0
    n_host: int = 0
    n_day: int = 0
    n_week: int = 0
    waits: dict[int, int] = field(default_factory=dict)
    exact: list[float] = field(default_factory=list)

    def merge(self, other: Acc) -> None:
        """Add `other` in."""
        self.seconds += other.seconds
        self.idle += other.idle
        self.n_user += other.n_user
        self.n_host += other.n_host
        self.n_day += other.n_day
        self.n_week += other.n_week
        for b, n in other.waits.items():
            self.waits[b] = self.waits.get(b, 0) + n
        self.exact.extend(other.exact)


@dataclass(frozen=True, slots=True)
class LeaseRow:
    """A lease with its job's kind, state and sessions; `released` is now for
    one still held."""

    job_id: int
    holder: str
    device_id: str
    kind: str
    state: str
    sessions: int
    acquired: float
    released: float


def _grouped(rows: Iterable, now: float) -> dict[int, list[LeaseRow]]:
    """job id → its leases, from rows (job_id, holder, device_id, kind, state,
    sessions, acquired_at, released_at or None)."""
    out: dict[int, list[LeaseRow]] = {}
    for j, h, d, k, s, n, a, r in rows:
        out.setdefault(j, []).append(LeaseRow(j, h, d, k, s, n, a, now if r is None else r))
    return out


def _pieces(leases: list[LeaseRow], lo: float, hi: float) -> list[tuple[float, str, float]]:
    """(day, host, seconds) of each lease clipped to [lo, hi) and cut at UTC
    midnights; a lease of no length inside (lo, hi) is a piece of 0 s."""
    out = []
    for le in leases:
        a, r = max(le.acquired, lo), min(le.released, hi)
        host = le.device_id.partition(":")[0]
        if r <= a:
            if r == a and lo < a < hi:
                out.append((day_of(a), host, 0.0))
            continue
        t = a
        while t < r:
            day = day_of(t)
            end = min(r, day + DAY_S)
            out.append((day, host, end - t))
            t = end
    return out


def add_job(
    accs: dict[Key, Acc],
    leases: list[LeaseRow],
    lo: float = -math.inf,
    hi: float = math.inf,
    whole: bool = False,
) -> None:
    """Add one job's leases clipped to [lo, hi) to `accs`, its counts as the
    module says. `whole`: the days a count goes on are chosen from the whole
    leases (the window's first day of a job rolled up: a count that belongs
    to a later day is that day's rollup's), else from the clipped ones."""
    got = _pieces(leases, lo, hi)
    if not got:
        return
    first = leases[0]
    holder, kind, state = first.holder, first.kind, first.state
    idle = kind == "hold" and not first.sessions

    def acc(day: float, host: str) -> Acc:
        k = (day, holder, host, kind, state)
        a = accs.get(k)
        if a is None:
            a = accs[k] = Acc()
        return a

    present: dict[float, set[str]] = {}
    for day, host, secs in got:
        a = acc(day, host)
        a.seconds += secs
        if idle:
            a.idle += secs
        present.setdefault(day, set()).add(host)
    basis = _pieces(leases, -math.inf, math.inf) if whole else got

    def count(day: float, what: str, host: str = "") -> None:
        hosts = present.get(day, ())
        if host:
            if host in hosts:
                setattr(acc(day, host), what, getattr(acc(day, host), what) + 1)
        elif hosts:
            h = max(hosts)
            setattr(acc(day, h), what, getattr(acc(day, h), what) + 1)

    days = {d for d, _h, _s in basis}
    count(max(days), "n_user")
    last_on: dict[str, float] = {}
    for d, h, _s in basis:
        last_on[h] = max(last_on.get(h, d), d)
    for h, d in last_on.items():
        count(d, "n_host", h)
    last_in: dict[float, float] = {}
    for d in days:
        count(d, "n_day")
        w = week_of(d)
        last_in[w] = max(last_in.get(w, d), d)
    for d in last_in.values():
        count(d, "n_week")


def add_wait(
    accs: dict[Key, Acc],
    holder: str,
    device_id: str,
    kind: str,
    state: str,
    assigned_at: float,
    wait: float,
    exact: bool,
) -> None:
    """Count one grant's wait (seconds) on its day's row of the job's first
    device's host: as a value (`exact`) or in its histogram bucket."""
    k = (day_of(assigned_at), holder, device_id.partition(":")[0], kind, state)
    a = accs.get(k)
    if a is None:
        a = accs[k] = Acc()
    if exact:
        a.exact.append(wait)
    else:
        b = bucket(wait)
        a.waits[b] = a.waits.get(b, 0) + 1


def acc_of_row(r) -> Acc:
    """An Acc from a usage_days row (seconds, idle, n_user, n_host, n_day,
    n_week, waits)."""
    waits = {int(b): n for b, n in loads(r["waits"]).items()}
    return Acc(r["seconds"], r["idle"], r["n_user"], r["n_host"], r["n_day"], r["n_week"], waits)


def roll_up(tx: Tx, limit: int = ROLL_BATCH_JOBS) -> int:
    """Roll up to `limit` finished jobs with no lease still held into
    usage_days, and mark their leases rolled up. Returns how many jobs."""
    ids = [r[0] for r in tx.all("rollup_candidates", (limit,))]
    if not ids:
        return 0
    ids_json = dumps(ids)
    accs: dict[Key, Acc] = {}
    for leases in _grouped(tx.all("ledger_job_leases", (ids_json,)), tx.now).values():
        add_job(accs, leases)
    for holder, device_id, kind, state, assigned_at, wait in tx.all("rollup_waits", (ids_json,)):
        add_wait(accs, holder, device_id, kind, state, assigned_at, wait, exact=False)
    for key, a in accs.items():
        old = tx.one("usage_day_get", key)
        if old is not None:
            a.merge(acc_of_row(old))
        tx.exec(
            "usage_day_put",
            (*key, a.seconds, a.idle, a.n_user, a.n_host, a.n_day, a.n_week,
             dumps({str(b): n for b, n in sorted(a.waits.items())})),
        )  # fmt: skip
    tx.exec("leases_mark_rolled", (ids_json,))
    return len(ids)


def expire(tx: Tx, cutoff: float, limit: int = EXPIRE_BATCH_JOBS) -> list[int]:
    """Delete up to `limit` jobs and holds that finished before `cutoff`
    (seconds since the epoch), whose leases are rolled up and that no job
    still waiting names as a dependency, with their leases, dependencies,
    idle rules and events; and up to `limit` events older than `cutoff`.
    Returns the ids of the jobs deleted (their logs are the caller's)."""
    ids = [int(r[0]) for r in tx.all("retain_expired_jobs", (cutoff, limit))]
    if ids:
        ids_json = dumps(ids)
        arrays = [r[0] for r in tx.all("retain_arrays_of", (ids_json,))]
        tx.exec("retain_delete_deps", (ids_json,))
        tx.exec("retain_delete_hold_idle", (ids_json,))
        tx.exec("retain_delete_leases", (ids_json,))
        tx.exec("retain_delete_job_events", (ids_json,))
        tx.exec("retain_delete_jobs", (ids_json,))
        if arrays:
            tx.exec("retain_delete_empty_arrays", (dumps(arrays),))
    tx.exec("retain_delete_events", (cutoff, limit))
    return ids


def log_owners(tx: Tx, ids: list[int], chunk: int = 5000) -> list[tuple[int, str, float | None]]:
    """(job id, Unix user, finished_at or None) of each job of `ids` that
    exists (the log quota's owners), `chunk` ids per query."""
    out = []
    for start in range(0, len(ids), chunk):
        rows = tx.all("log_owners", (dumps(ids[start : start + chunk]),))
        out += [(int(r[0]), str(r[1]), None if r[2] is None else float(r[2])) for r in rows]
    return out
