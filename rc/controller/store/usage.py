"""The usage ledger and fair share's inputs (README "Who used the devices" and
"Sharing fairly").

Reads the store's leases (one row per device a job or hold was granted) and
jobs; writes only the fair-share weights (`set_weight`) and a hold's session
count (`session_opened`). The ledger is computed here once and served to
`rc usage`, GET /v1/usage, the dashboard's usage view and /metrics alike.

A "user" here is an account: the Unix user a job runs as (a lease's holder,
jobs.unix_user), the person, whether they submitted through the local
socket or a token mapped to them; never a job's display label or owner.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable

from rc.controller.errors import Refused
from rc.controller.planning import fairshare
from rc.controller.store import ledger
from rc.controller.store.db import Tx
from rc.proto.errors import ErrorCode
from rc.proto.model import SHARE_WEIGHT_MAX, SHARE_WEIGHT_MIN
from rc.proto.wire import UsageReport, UsageRow

__all__ = [
    "BY",
    "DAY_S",
    "SHARES_REFRESH_S",
    "WEIGHT_MAX",
    "ShareCache",
    "daily",
    "device_seconds_by_user",
    "percentile",
    "report",
    "session_opened",
    "set_weight",
    "weights",
]

BY = ("user", "host", "device", "day", "week")
"""What a ledger row may count: one row per user, host, device, day or week."""
DAY_S = 86400.0
WEIGHT_MIN, WEIGHT_MAX = SHARE_WEIGHT_MIN, SHARE_WEIGHT_MAX
"""The fair-share weights allowed (rc.proto.model)."""
SHARES_REFRESH_S = 60.0
"""Fair-share standings are recomputed at most this often (and at once when a
weight changes): a pass reads them, it does not sum the lease history."""


def percentile(sorted_values: list[float], p: float) -> float:
    """The nearest-rank p-th percentile (0 < p <= 1) of ascending values; 0.0 for none."""
    if not sorted_values:
        return 0.0
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]


def _day(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d")


def report(
    tx: Tx, since: float, by: str = "user", user: str = "", horizon: float = 0.0
) -> UsageReport:
    """The ledger over [since, tx.now] (seconds since the epoch), one row per
    `by` key (BY), only `user`'s when given. A lease open across the window's
    edge counts only its time inside the window; a lease still held counts
    up to now. Read from the daily rollups and the leases not rolled up
    (rc.controller.store.ledger); `by` device from the leases kept, which
    `rc serve --retain` deletes (`horizon`: its cutoff, 0 for none). Raises
    Refused (400) for a `by` not in BY."""
    if by not in BY:
        raise Refused(ErrorCode.BAD_REQUEST, f"by {by!r} is not one of {', '.join(BY)}")
    if by == "device":
        return _summed(tx, since, by, user)
    return ledger.report(tx, since, by, user, horizon)


def daily(
    tx: Tx, days: int
) -> tuple[list[str], dict[tuple[str, str], float], dict[str, tuple[float, float]]]:
    """The last `days` UTC days (today included), oldest first; device-seconds
    per (day, user), cut at midnight as report(by="day") cuts them; and per
    day the (p50, p95) wait of the grants that day (a day without grants left
    out). What the dashboard's usage picture draws."""
    today = math.floor(tx.now / DAY_S) * DAY_S
    since = today - (days - 1) * DAY_S
    names = [_day(since + i * DAY_S) for i in range(days)]
    seconds, per_day = ledger.daily_seconds(tx, since)
    waits = {}
    for d, acc in per_day.items():
        n, p50, p95 = ledger.percentiles(acc)
        if n:
            waits[d] = (p50, p95)
    return names, seconds, waits


def _empty() -> dict:
    return {
        "seconds": 0.0,
        "idle": 0.0,
        "jobs": {},
        "holds": {},
        "waits": 0,
        "p50": 0.0,
        "p95": 0.0,
    }


def _collect(tx: Tx, params: dict, leases: bool = True) -> dict[str, dict]:
    """key → the sums and counts (unless not `leases`) and the wait ranks
    SQLite computed for it."""
    rows: dict[str, dict] = {}
    for k, kind, state, seconds, idle, n in tx.all("usage_sums", params) if leases else ():
        r = rows.setdefault(k, _empty())
        r["seconds"] += seconds or 0.0
        r["idle"] += idle or 0.0
        r["holds" if kind == "hold" else "jobs"][state] = n
    for k, n, i, wait in tx.all("usage_wait_ranks", params):
        r = rows.setdefault(k, _empty())
        r["waits"] = n
        if i == (n + 1) // 2:
            r["p50"] = wait
        if i == (95 * n + 99) // 100:
            r["p95"] = wait
    return rows


def _added(rows: Iterable[dict], waits: dict) -> dict:
    """The total of per-user or per-host rows (a job's leases all have one
    holder and one host, so its device-time and its count add up), with the
    wait ranks of everyone (`waits`, a _collect row)."""
    total = _empty()
    for r in rows:
        total["seconds"] += r["seconds"]
        total["idle"] += r["idle"]
        for what in ("jobs", "holds"):
            for state, n in r[what].items():
                total[what][state] = total[what].get(state, 0) + n
    total.update(waits=waits["waits"], p50=waits["p50"], p95=waits["p95"])
    return total


def _record(k: str, r: dict) -> UsageRow:
    return UsageRow(
        key=k,
        device_seconds=round(r["seconds"], 3),
        jobs=dict(sorted(r["jobs"].items())),
        holds=dict(sorted(r["holds"].items())),
        idle_hold_seconds=round(r["idle"], 3),
        waits=r["waits"],
        wait_p50_seconds=round(r["p50"], 3),
        wait_p95_seconds=round(r["p95"], 3),
    )


def _summed(tx: Tx, since: float, by: str, user: str) -> UsageReport:
    """report() for user, host or device: SQLite sums, counts and ranks, no
    row per lease in Python (README "Performance": a 30-day ledger of
    100,000 jobs)."""
    params = {"since": since, "now": tx.now, "user": user, "by": by}
    rows = _collect(tx, params)
    if by == "device":  # a job on 4 devices is in 4 rows: count the total apart
        total = _collect(tx, {**params, "by": "total"}).get("", _empty())
    else:
        waits = _collect(tx, {**params, "by": "total"}, leases=False).get("", _empty())
        total = _added(rows.values(), waits)
    keys = sorted(rows, key=lambda k: (-rows[k]["seconds"], k))
    return UsageReport(
        by=by,
        since=since,
        until=tx.now,
        rows=tuple(_record(k, rows[k]) for k in keys),
        total=_record("total", total),
        user=user,
    )


def device_seconds_by_user(tx: Tx) -> dict[str, float]:
    """Every lease holder's device-seconds ever (the rollups and the leases
    not rolled up), leases still held counted up to now (the counter rc_device_seconds_total of /metrics)."""
    out = {r["holder"]: r["seconds"] or 0.0 for r in tx.all("rolled_seconds_by_holder")}
    for r in tx.all("device_seconds_by_holder", {"now": tx.now}):
        out[r["holder"]] = out.get(r["holder"], 0.0) + r["seconds"]
    return dict(sorted(out.items()))


# -- fair share ---------------------------------------------------------------


def weights(tx: Tx) -> dict[str, float]:
    """Every fair-share weight an admin set: user → weight (others have 1)."""
    return {r["user"]: r["weight"] for r in tx.all("share_weights_all")}


def set_weight(tx: Tx, user: str, weight: float) -> None:
    """Set `user`'s fair-share weight (WEIGHT_MIN <= weight <= WEIGHT_MAX; 1
    removes the row: the default). Raises Refused (400) outside that range."""
    if not (WEIGHT_MIN <= weight <= WEIGHT_MAX) or math.isnan(weight):
        raise Refused(
            ErrorCode.BAD_REQUEST,
            f"weight {weight} is outside the allowed range: {WEIGHT_MIN:g} to {WEIGHT_MAX:g}",
        )
    if weight == 1:
        tx.exec("share_weight_reset", (user,))
    else:
        tx.exec("share_weight_set", (user, float(weight), tx.now))
    tx.notify("shares")


def session_opened(tx: Tx, hold_id: int) -> None:
    """Count a session opened in hold `hold_id` (the ledger's idle hold hours)."""
    tx.exec("hold_session_opened", (hold_id,))


class ShareCache:
    """Fair share's standings, computed from the store at most every
    SHARES_REFRESH_S seconds (of the store's clock) and at once after
    `invalidate()` (a weight changed). `half_life` in seconds; 0: fair share
    off (no standings, no adjustments).

    What the scheduler orders by is a pure function of the standings it
    read: the same history read at the same time gives the same order."""

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self._cached: tuple[float, dict[str, fairshare.Standing]] | None = None

    def invalidate(self) -> None:
        """Recompute at the next read (a weight changed)."""
        self._cached = None

    def note_submitter(self, user: str) -> None:
        """Unix user `user` submits a job ("": not known yet): recompute at
        the next read unless they are in the standings already (a newcomer
        changes everyone's entitlement)."""
        cached = self._cached
        if cached is not None and user not in cached[1]:
            self._cached = None

    def standings(self, tx: Tx) -> dict[str, fairshare.Standing]:
        """user → Standing (rc.controller.planning.fairshare.standings); {} when off."""
        if self.half_life <= 0:
            return {}
        cached = self._cached
        if cached is not None and 0 <= tx.now - cached[0] < SHARES_REFRESH_S:
            return cached[1]
        got = compute_standings(tx, self.half_life)
        self._cached = (tx.now, got)
        return got

    def adjustments(self, tx: Tx) -> dict[str, int]:
        """user → fair-share adjustment (priority steps), only those above 0."""
        return {u: s.adjust for u, s in self.standings(tx).items() if s.adjust}


def compute_standings(tx: Tx, half_life: float) -> dict[str, fairshare.Standing]:
    """The standings at tx.now, from the leases (decayed with `half_life`
    seconds), the weights and the queue. Costs the leases of the last
    HORIZON_HALF_LIVES half-lives."""
    params = {
        "now": tx.now,
        "half_life": half_life,
        "horizon": tx.now - fairshare.HORIZON_HALF_LIVES * half_life,
    }
    used = {r["holder"]: r["used"] or 0.0 for r in tx.all("decayed_usage", params)}
    queued = [r["unix_user"] for r in tx.all("queued_users")]
    w = weights(tx)
    return fairshare.standings(used, w, queued)
