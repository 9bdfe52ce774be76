"""Which devices a queued job may run on: its candidates (README "Order:
priority, first come first served, aging, the per-user cap" and "Several
devices for one job").

A job's candidates are its pinned devices, or the devices its selector
matches, minus devices whose runtime ceiling is below the job's ask and
those whose worker does not run jobs as the job's Unix user (`runs_jobs_of`:
a single-user worker runs only its own user's). The same rules say, in
words, why a submit is refused (`not_run_here`), and what runtime bound a
job runs under (`runtime_on`).

Pure: nothing here reads the clock, the database or the network.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from rc.controller.planning.placement import device_key
from rc.controller.planning.records import Slot
from rc.proto import selector as selectors
from rc.proto.model import ROOT

__all__ = [
    "SINGLE_USER_HINT",
    "LazyMatches",
    "candidates",
    "fits_ceiling",
    "match_devices",
    "not_run_here",
    "runs_jobs_of",
    "runtime_on",
]


def fits_ceiling(ask: int, ceiling: int) -> bool:
    """Whether a job asking `ask` seconds (0: none) may run under `ceiling` (0: none)."""
    return ceiling == 0 or ask == 0 or ask <= ceiling


def runs_jobs_of(slot: Slot, unix_user: str) -> bool:
    """Whether the worker of `slot` runs a job whose Unix user is `unix_user`."""
    if slot.run_as:
        return unix_user == slot.run_as
    return slot.root_ok or unix_user != ROOT


SINGLE_USER_HINT = (
    "a worker that is not root runs only its own user's jobs; one started as root runs "
    "every user's, each as that user (on a one-box: sudo rc up -d)"
)


def not_run_here(host: str, slot: Slot, unix_user: str) -> str:
    """Why the worker of `host` (`slot`) does not run a job of `unix_user`,
    in words (what `rc explain` and a refused submit say)."""
    if slot.run_as:
        return f"{host} runs jobs as {slot.run_as} only ({SINGLE_USER_HINT})"
    return f"{host} does not run root's jobs (its worker config does not set allow_root_jobs)"


def runtime_on(ask: int, ceilings: Iterable[int]) -> int:
    """The runtime bound of a job asking `ask` seconds (0: none) on devices
    with these ceilings: its ask, else the lowest ceiling among them (0:
    none at all). The worker stops it there."""
    if ask:
        return ask
    return min((c for c in ceilings if c), default=0)


def candidates(
    selector: str,
    pins: tuple[str, ...],
    max_runtime: int,
    slots: Mapping[str, Slot],
    matches: Mapping[str, frozenset[str]],
    unix_user: str = "",
    excluded: tuple[str, ...] = (),
) -> tuple[str, ...]:
    """A queued job's candidate device ids: its pinned devices in their order
    (a job with no selector), or the devices its selector matches
    (`matches`, as for plan()) in natural order (gpu2 before gpu10); minus
    devices that do not exist, those whose runtime ceiling is below its ask
    (seconds), those whose worker does not run jobs as `unix_user`
    (runs_jobs_of; "" asks nothing of them), and the `excluded` ones."""
    if selector:
        pool: Iterable[str] = sorted(matches.get(selector, frozenset()), key=device_key)
    else:
        pool = pins
    return tuple(
        d
        for d in pool
        if d in slots
        and d not in excluded
        and fits_ceiling(max_runtime, slots[d].max_runtime)
        and (not unix_user or runs_jobs_of(slots[d], unix_user))
    )


def match_devices(labels: Mapping[str, Mapping[str, str]], sel: str) -> frozenset[str]:
    """Ids of the devices whose effective labels a normalised selector matches.

    `labels` maps device id → effective labels (load_labels). Raises
    SelectorError for text that does not parse (stored selectors always do).
    """
    parsed = selectors.parse(sel)
    return frozenset(d for d, ls in labels.items() if parsed.matches(ls))


class LazyMatches(dict):
    """selector → matching device ids, computed on first lookup."""

    def __init__(self, compute: Callable[[str], frozenset[str]]) -> None:
        super().__init__()
        self._compute = compute

    def __missing__(self, sel: str) -> frozenset[str]:
        hit = self[sel] = self._compute(sel)
        return hit

    def get(self, sel: str, default=None):  # plan() uses .get
        return self[sel]
