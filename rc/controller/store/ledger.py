"""The ledger from the daily rollups (README "Who used the devices" and
"History that ends").

A window [since, now] is read in three parts, none counted twice:
1. the rollups (rc.controller.store.rollups) of its whole UTC days, from the
   midnight after `since` (from the midnight before it when `since` is
   older than the retention's `horizon`: the leases of that first day may be
   gone, so it is counted whole);
2. the leases of jobs rolled up that held a device in [since, that midnight),
   clipped to it, a job counted there only when its count is not on a later
   day's rollup;
3. the leases not rolled up yet (jobs still on, or just ended), clipped to
   the window, each job counted once per key.
Waits go the same way by the day a job was granted devices; a rolled-up wait
is read from its histogram bucket (within 9 %), the others exactly.
"""

from __future__ import annotations

import datetime as dt
import math

from rc.controller.store.db import Tx, dumps, loads
from rc.controller.store.rollups import (
    DAY_S,
    Acc,
    Key,
    _grouped,
    add_job,
    add_wait,
    bucket_value,
    day_of,
    week_of,
)
from rc.proto.wire import UsageReport, UsageRow

__all__ = ["COUNT_OF", "daily_seconds", "gather", "percentiles", "report"]

COUNT_OF = {"user": "n_user", "host": "n_host", "day": "n_day", "week": "n_week"}
"""Which rollup count a view adds up (the total: n_user)."""


GROUPS = {
    "user": (0, 1, 0),
    "host": (0, 0, 1),
    "day": (1, 0, 0),
    "week": (1, 0, 0),
    "daily": (1, 1, 0),
}
"""What each view needs of a rollup row, (day, holder, host): the database
adds up the rollups over the rest (their key has 0.0 or '' there)."""


def gather(
    tx: Tx, since: float, user: str = "", horizon: float = 0.0, view: str = "user"
) -> dict[Key, Acc]:
    """Every row of the window [since, tx.now] (of holder `user`, "" for all),
    as the module says; `horizon`: the retention's cutoff (0: none). The
    rollups come added up for `view` (GROUPS): only the parts of a key that
    view reads are kept."""
    now = tx.now
    day = day_of(since)
    edge = since if since == day else day + DAY_S
    if since < horizon:
        edge = day
    accs: dict[Key, Acc] = {}
    g_day, g_holder, g_host = GROUPS[view]
    p = {"from": edge, "now": now, "user": user, "g_day": g_day, "g_holder": g_holder,
         "g_host": g_host}  # fmt: skip
    for d, u, h, kind, state, seconds, idle, n_user, n_host, n_day, n_week in tx.iter(
        "usage_days_sums", p
    ):
        accs[(d, u, h, kind, state)] = Acc(seconds, idle, n_user, n_host, n_day, n_week)
    for d, u, h, kind, state, many in tx.iter("usage_days_waits", p):
        a = accs.get((d, u, h, kind, state))
        if a is None:
            a = accs[(d, u, h, kind, state)] = Acc()
        w = a.waits
        for one in loads(many):
            for b, n in one.items():
                w[int(b)] = w.get(int(b), 0) + n
    if edge > since:
        p = {"since": since, "day": day, "edge": edge, "user": user}
        ids = sorted({r[0] for r in tx.iter("ledger_edge_jobs", p)})
        for start in range(0, len(ids), 5000):
            rows = tx.all("ledger_job_leases", (dumps(ids[start : start + 5000]),))
            for leases in _grouped(rows, now).values():
                add_job(accs, leases, since, edge, whole=True)
        for h, d, k, s, at, wait in tx.iter("ledger_edge_waits", p):
            add_wait(accs, h, d, k, s, at, wait, exact=True)
    p = {"since": since, "now": now, "user": user}
    for leases in _grouped(tx.iter("ledger_unrolled_leases", p), now).values():
        add_job(accs, leases, since, now)
    for h, d, k, s, at, wait in tx.iter("ledger_unrolled_waits", p):
        add_wait(accs, h, d, k, s, at, wait, exact=True)
    return accs


def _name(day: float, by: str) -> str:
    t = week_of(day) if by == "week" else day
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def percentiles(a: Acc) -> tuple[int, float, float]:
    """(count, nearest-rank p50, p95) of the waits of `a`."""
    values = sorted([(bucket_value(b), n) for b, n in a.waits.items()] + [(w, 1) for w in a.exact])
    n = sum(c for _v, c in values)
    out = []
    for p in (0.50, 0.95):
        rank, seen, got = max(1, math.ceil(p * n)), 0, 0.0
        for v, c in values:
            seen += c
            if seen >= rank:
                got = v
                break
        out.append(got)
    return n, out[0], out[1]


class _Row:
    __slots__ = ("acc", "holds", "jobs")

    def __init__(self) -> None:
        self.acc = Acc()
        self.jobs: dict[str, int] = {}
        self.holds: dict[str, int] = {}

    def add(self, kind: str, state: str, a: Acc, counted: str) -> None:
        self.acc.seconds += a.seconds
        self.acc.idle += a.idle
        for b, n in a.waits.items():
            self.acc.waits[b] = self.acc.waits.get(b, 0) + n
        self.acc.exact.extend(a.exact)
        n = getattr(a, counted)
        if n:
            into = self.holds if kind == "hold" else self.jobs
            into[state] = into.get(state, 0) + n

    def record(self, key: str) -> UsageRow:
        waits, p50, p95 = percentiles(self.acc)
        return UsageRow(
            key=key,
            device_seconds=round(self.acc.seconds, 3),
            jobs=dict(sorted(self.jobs.items())),
            holds=dict(sorted(self.holds.items())),
            idle_hold_seconds=round(self.acc.idle, 3),
            waits=waits,
            wait_p50_seconds=round(p50, 3),
            wait_p95_seconds=round(p95, 3),
        )


def report(tx: Tx, since: float, by: str, user: str = "", horizon: float = 0.0) -> UsageReport:
    """The ledger over [since, tx.now] per `by` ("user", "host", "day" or
    "week"; rc.controller.store.usage.report checks it), only `user`'s when
    given, with its total row; `horizon` as gather's."""
    rows: dict[str, _Row] = {}
    total = _Row()
    counted = COUNT_OF[by]
    for (day, holder, host, kind, state), a in gather(tx, since, user, horizon, by).items():
        key = holder if by == "user" else host if by == "host" else _name(day, by)
        r = rows.get(key)
        if r is None:
            r = rows[key] = _Row()
        r.add(kind, state, a, counted)
        total.add(kind, state, a, "n_user")
    empty = [
        k
        for k, r in rows.items()
        if not (r.acc.seconds or r.jobs or r.holds or r.acc.exact or r.acc.waits)
    ]
    for k in empty:
        del rows[k]
    if by in ("day", "week"):
        keys = sorted(rows)
    else:
        keys = sorted(rows, key=lambda k: (-rows[k].acc.seconds, k))
    return UsageReport(
        by=by,
        since=since,
        until=tx.now,
        rows=tuple(rows[k].record(k) for k in keys),
        total=total.record("total"),
        user=user,
    )


def daily_seconds(tx: Tx, since: float) -> tuple[dict[tuple[str, str], float], dict[str, Acc]]:
    """Device-seconds per (day name, user) from `since` (a UTC midnight), and
    per day name the waits (an Acc): what the dashboard's picture draws."""
    seconds: dict[tuple[str, str], float] = {}
    waits: dict[str, Acc] = {}
    for (day, holder, _h, _k, _s), a in gather(tx, since, view="daily").items():
        name = _name(day, "day")
        if a.seconds:
            seconds[(name, holder)] = seconds.get((name, holder), 0.0) + a.seconds
        w = waits.setdefault(name, Acc())
        for b, n in a.waits.items():
            w.waits[b] = w.waits.get(b, 0) + n
        w.exact.extend(a.exact)
    return seconds, waits
