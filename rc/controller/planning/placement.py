"""Placement: which devices of one host a job gets (README "Several devices
for one job").

Pure functions and a small class, used by rc.controller.planning.planner. Nothing here
reads the clock, the database or the network.

Topology. A host's worker reports, for each pair of its GPUs, the link class
`nvidia-smi topo -m` gives it (rc.proto.model.Link); its `rank` orders them,
0 (NVLink) best, 6 (unknown) worst. A pair the host left out is unknown when
the host reports any link at all, and rank 0 when it reports none: a host
without topology (CPU devices) has every pair equal.

The best set. Among the sets of N of a host's available devices, the best is
the one whose worst pairwise rank is lowest, then the lowest sum of pairwise
ranks, then the one that breaks the least (`damage`), then the lowest device
ids (natural order: gpu2 before gpu10). Up to EXHAUSTIVE_MAX candidate sets
every set is compared; past that a greedy search grows a set from each seed
device, adding the device that least raises (worst, sum), and the grown sets
are compared the same way.

Damage (packing). For each rank r present on a host, its devices fall into
groups: the connected parts when only pairs of rank ≤ r count as joined (on
a host with two NVLink quads and SYS between them: the two quads at NV, the
whole host at SYS). A group is intact while every member is free. Taking a
set breaks the intact groups it touches; its damage is, per rank from best
to worst, the total size of the intact groups it breaks. Less is better, so
a narrow job lands where a group is already broken, and the intact groups
stay whole for wide jobs.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

from rc.proto.model import Link

__all__ = [
    "EXHAUSTIVE_MAX",
    "NO_TOPOLOGY_RANK",
    "RANKS",
    "HostTopology",
    "device_key",
    "host_of",
    "pair",
]

EXHAUSTIVE_MAX = 1000
"""Most candidate sets the best-set search compares one by one (12 choose 6
is 924); past it the search is greedy, from each seed device."""
NO_TOPOLOGY_RANK = 0
"""The rank of every pair on a host that reports no topology (CPU devices)."""
UNKNOWN_RANK = Link.UNKNOWN.rank
RANKS = len(Link)
"""Ranks run 0..RANKS-1."""

_DIGITS = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)
def device_key(device_id: str) -> tuple:
    """A sort key giving devices in natural order: gpu2 before gpu10
    (remembered: a pass sorts the same ids many times)."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(device_id))


def host_of(device_id: str) -> str:
    """The host part of a device id "host:name"."""
    return device_id.rpartition(":")[0]


def pair(a: str, b: str) -> tuple[str, str]:
    """The key of a pair of devices in a links map: the two ids, in order."""
    return (a, b) if a < b else (b, a)


class HostTopology:
    """How the devices of one host are connected, and which groups of them
    are intact (every member free) as a pass takes devices.

    `devices`: the host's device ids. `ranks`: pair(a, b) → rank for the
    pairs its worker reported (empty: no topology, every pair rank 0).
    `free(device)` says whether a device is free when the groups are first
    counted; `take()` then tells it what a pass took.
    """

    def __init__(
        self,
        devices: Iterable[str],
        ranks: Mapping[tuple[str, str], int],
        free: Callable[[str], bool],
    ) -> None:
        self.devices = sorted(devices, key=device_key)
        self._ranks = ranks
        self._missing = UNKNOWN_RANK if ranks else NO_TOPOLOGY_RANK
        self.uniform = not ranks
        # levels: (rank, device → group number, group sizes, free members per group)
        self._levels: list[tuple[int, dict[str, int], list[int], list[int]]] = []
        for r in self._level_ranks():
            group = self._groups(r)
            sizes = [0] * (max(group.values(), default=-1) + 1)
            left = [0] * len(sizes)
            for d, g in group.items():
                sizes[g] += 1
                left[g] += 1 if free(d) else 0
            self._levels.append((r, group, sizes, left))

    def rank(self, a: str, b: str) -> int:
        """The rank of the link between two devices of this host."""
        return self._ranks.get(pair(a, b), self._missing)

    def score(self, devices: Sequence[str]) -> tuple[int, int]:
        """(worst pairwise rank, sum of pairwise ranks) of a set (0, 0 for one device)."""
        worst = total = 0
        for a, b in itertools.combinations(devices, 2):
            r = self.rank(a, b)
            total += r
            worst = max(worst, r)
        return worst, total

    def damage(self, devices: Iterable[str]) -> tuple[int, ...]:
        """Per rank 0..RANKS-1, the total size of the intact groups taking
        `devices` would break."""
        out = [0] * RANKS
        for r, group, sizes, left in self._levels:
            broken = {group[d] for d in devices if d in group}
            out[r] += sum(sizes[g] for g in broken if left[g] == sizes[g])
        return tuple(out)

    def take(self, devices: Iterable[str]) -> None:
        """These devices are no longer free (a pass handed them out)."""
        for d in devices:
            for _r, group, _sizes, left in self._levels:
                g = group.get(d)
                if g is not None:
                    left[g] -= 1

    def best(self, avail: Sequence[str], count: int) -> tuple[tuple, tuple[str, ...]] | None:
        """The best set of `count` devices among `avail` (this host's, in
        natural order) and its key (worst, sum, damage, ids), or None when
        there are fewer than `count`."""
        if len(avail) < count:
            return None
        if self.uniform:  # every set scores alike and breaks the same one group
            chosen = tuple(avail[:count])
            return self._key(chosen), chosen
        if count == 1:
            return min((self._key((d,)), (d,)) for d in avail)
        if math.comb(len(avail), count) <= EXHAUSTIVE_MAX:
            sets: Iterable[tuple[str, ...]] = itertools.combinations(avail, count)
        else:
            sets = (self._grow(seed, avail, count) for seed in avail)
        return min((self._key(s), s) for s in sets)

    def _key(self, chosen: tuple[str, ...]) -> tuple:
        worst, total = self.score(chosen)
        return (worst, total, self.damage(chosen), tuple(device_key(d) for d in chosen))

    def _grow(self, seed: str, avail: Sequence[str], count: int) -> tuple[str, ...]:
        """Greedy: from `seed`, add the device that least raises (worst, sum)."""
        chosen = [seed]
        worst = {d: self.rank(seed, d) for d in avail if d != seed}
        total = dict(worst)
        top = 0  # the worst rank within `chosen`
        while len(chosen) < count:
            d = min(worst, key=lambda x: (max(top, worst[x]), total[x], device_key(x)))
            top = max(top, worst[d])
            chosen.append(d)
            del worst[d], total[d]
            for x, w in worst.items():
                r = self.rank(d, x)
                worst[x] = max(w, r)
                total[x] += r
        return tuple(sorted(chosen, key=device_key))

    def _level_ranks(self) -> list[int]:
        if self.uniform:
            return [NO_TOPOLOGY_RANK]
        present = set(self._ranks.values())
        if len(self._ranks) < math.comb(len(self.devices), 2):
            present.add(self._missing)
        return sorted(present)

    def _groups(self, r: int) -> dict[str, int]:
        """device → group number at rank `r` (union-find over pairs ≤ r)."""
        if self.uniform or r >= self._missing:  # every pair is this good: one group
            return dict.fromkeys(self.devices, 0)
        parent = {d: d for d in self.devices}

        def root(d: str) -> str:
            while parent[d] != d:
                parent[d] = parent[parent[d]]
                d = parent[d]
            return d

        for (a, b), rk in self._ranks.items():  # a pair left out is worse than r
            if rk <= r and a in parent and b in parent:
                parent[root(a)] = root(b)
        numbers: dict[str, int] = {}
        return {d: numbers.setdefault(root(d), len(numbers)) for d in self.devices}
