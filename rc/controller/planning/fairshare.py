"""Fair share, its one definition (README "Sharing fairly").

Pure arithmetic over numbers the store read; nothing here reads the clock
or the database.

- A lease's **decayed device-seconds** at `now`: each second a device was
  held counts 2^(-age / half_life), age being how long ago that second was
  (`decayed`). A 4-device lease counts four times: one lease per device.
- The **users** fair share looks at: everyone with decayed usage or a job
  in the queue. Each has a **weight** (1 unless an admin set one with
  `rc share set USER W`); their **entitlement** is their weight over the
  sum of the weights; their **share** is their decayed usage over everyone's.
- The **adjustment**: 0 while a user's share is at most their entitlement;
  above it, one step per FAIR_SHARE_STEP (a quarter) of their entitlement
  they are over, rounded up, at most FAIR_SHARE_MAX:
  ceil((share / entitled - 1) / FAIR_SHARE_STEP), capped at 10.
- A queued job's **effective priority**: priority + aging steps - its
  account's adjustment (its Unix user's: rc.controller.planning.priority).

The adjustment only ever lowers, by at most FAIR_SHARE_MAX steps, and aging
still raises every queued job by one step per `aging` seconds, so fair share
never starves anyone: a job is ahead of every job queued
(2 * PRIORITY_MAX + FAIR_SHARE_MAX + 1) * aging seconds after it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "FAIR_SHARE_MAX",
    "FAIR_SHARE_STEP",
    "HORIZON_HALF_LIVES",
    "Standing",
    "adjustment",
    "decayed",
    "standings",
    "words",
]

FAIR_SHARE_MAX = 10
"""The largest fair-share adjustment, in priority steps."""
FAIR_SHARE_STEP = 0.25
"""One adjustment step per this fraction of a user's entitlement they are over."""
HORIZON_HALF_LIVES = 10
"""Leases released more than this many half-lives ago are left out of the
decayed usage (they would count less than 0.1 %)."""


def decayed(acquired: float, released: float | None, now: float, half_life: float) -> float:
    """Decayed device-seconds at `now` of one lease held from `acquired` to
    `released` (None: still held; seconds since the epoch): the integral of
    2^(-(now - t) / half_life) over the time held, clipped to before `now`.
    A lease in the future, or one ending before it began, counts 0."""
    end = now if released is None else min(released, now)
    if end <= acquired or half_life <= 0:
        return 0.0
    k = math.log(2) / half_life
    return (math.exp(-k * (now - end)) - math.exp(-k * (now - acquired))) / k


def adjustment(share: float, entitled: float) -> int:
    """The fair-share adjustment (priority steps, 0..FAIR_SHARE_MAX) of a user
    whose share (0..1) and entitlement (0..1) these are."""
    if entitled <= 0 or share <= entitled:
        return 0
    # the epsilon keeps a whole number of steps whole under rounding (1.5 → 2, not 3)
    steps = math.ceil((share / entitled - 1) / FAIR_SHARE_STEP - 1e-9)
    return max(1, min(FAIR_SHARE_MAX, steps))  # over it at all: at least a step


@dataclass(frozen=True, slots=True)
class Standing:
    """One user's fair share: weight, decayed usage (device-seconds), share
    and entitlement (fractions 0..1) and the adjustment (priority steps)."""

    user: str
    weight: float
    usage: float
    share: float
    entitled: float
    adjust: int


def standings(
    usage: Mapping[str, float], weights: Mapping[str, float], queued: Iterable[str]
) -> dict[str, Standing]:
    """Every user's Standing: those with decayed usage (`usage`, user →
    device-seconds) and those with a queued job (`queued`); `weights` gives
    the weights an admin set (others: 1). Pure and deterministic."""
    # sorted, so the sums add in one order: the same inputs give the same bits
    users = sorted({u for u, v in usage.items() if v > 0} | set(queued))
    total_w = sum(weights.get(u, 1.0) for u in users)
    total_u = sum(max(0.0, usage.get(u, 0.0)) for u in users)
    out = {}
    for u in users:
        w = weights.get(u, 1.0)
        used = max(0.0, usage.get(u, 0.0))
        share = used / total_u if total_u > 0 else 0.0
        entitled = w / total_w if total_w > 0 else 0.0
        out[u] = Standing(u, w, used, share, entitled, adjustment(share, entitled))
    return out


def words(s: Standing, half_life: float, format_duration) -> str:
    """ "alice: 41% of recent device-hours (half-life 7d), entitled 25%"
    (`format_duration(seconds)` writes the half-life)."""
    return (
        f"{s.user}: {round(s.share * 100)}% of recent device-hours "
        f"(half-life {format_duration(half_life)}), entitled {round(s.entitled * 100)}%"
    )
