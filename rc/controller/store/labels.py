"""Device labels, usage sheets and topology: what a worker's probes found and
its operator declared, stored per device (the links between a host's GPUs
per host); and the writer's cache of which devices each selector matches.

Effective labels of a device: its declared labels overlaid by detected ones
(detected wins), plus `host`, `device` (its name) and `id`.
"""

from __future__ import annotations

from rc.controller.errors import Refused
from rc.controller.planning import match_devices
from rc.controller.store import queue
from rc.controller.store.db import Tx
from rc.proto.errors import ErrorCode
from rc.proto.model import LabelSource
from rc.proto.wire import DeviceLink, LabelsRequest

__all__ = [
    "MATCH_CACHE_MAX",
    "MatchCache",
    "device_names",
    "effective",
    "relabel",
    "set_health",
    "set_labels",
    "set_links",
]

MATCH_CACHE_MAX = 4096
"""Most selectors the writer's MatchCache remembers matches for; past it the
cache starts over (it also starts over whenever labels or devices change)."""


class MatchCache:
    """The writer's cache of effective labels, the devices each selector
    matches, and the hosts' topology (queue.links).

    Effective labels of a device: its declared labels overlaid by detected
    ones (detected wins), plus `host`, `device` (its name) and `id`. Any
    transaction that changes labels, links or the device set calls
    `invalidate()`; the next use reloads from the database inside the
    current transaction. At most MATCH_CACHE_MAX selectors are remembered.
    """

    def __init__(self) -> None:
        self._labels: dict[str, dict[str, str]] | None = None
        self._matches: dict[str, frozenset[str]] = {}
        self._links: dict[str, dict[tuple[str, str], int]] | None = None

    def invalidate(self) -> None:
        """Forget labels, matches and links (they or the device set changed)."""
        self._labels = None
        self._matches = {}
        self._links = None

    def links(self, tx: Tx) -> dict[str, dict[tuple[str, str], int]]:
        """host → its pair ranks (queue.links; loaded on first use after invalidate)."""
        if self._links is None:
            self._links = queue.links(tx)
        return self._links

    def labels(self, tx: Tx) -> dict[str, dict[str, str]]:
        """device id → effective labels (loaded on first use after invalidate)."""
        if self._labels is None:
            self._labels = effective(tx)
        return self._labels

    def matching(self, tx: Tx, sel: str) -> frozenset[str]:
        """Ids of the devices a normalised selector matches."""
        hit = self._matches.get(sel)
        if hit is None:
            hit = match_devices(self.labels(tx), sel)
            if len(self._matches) >= MATCH_CACHE_MAX:
                self._matches = {}
            self._matches[sel] = hit
        return hit


def effective(tx: Tx) -> dict[str, dict[str, str]]:
    """Effective labels of every device, read in one pass."""
    out: dict[str, dict[str, str]] = {}
    for r in tx.all("device_identities"):
        out[r["id"]] = {"host": r["host"], "device": r["name"], "id": r["id"]}
    for r in tx.all("all_labels"):  # declared first, then detected overwrites
        d = out.get(r["device_id"])
        if d is not None:
            d[r["key"]] = r["value"]
    return out


def set_labels(
    tx: Tx,
    host: str,
    names: tuple[str, ...],
    labels: dict[str, dict[str, str]] | None,
    declared: dict[str, dict[str, str]] | None,
    sheet: str | None,
    device_sheets: dict[str, str],
) -> None:
    """Store probe results, declared labels and usage sheets for a host.

    Detected labels: None says nothing; otherwise each device present in the
    map gets host-wide facts ("") overlaid by its own, replacing what was
    stored, and a device left out keeps its labels (the preservation rule:
    a probe that fails wipes nothing). Declared labels, when sent, replace
    every device's.
    Sheets: None keeps the host sheet; device sheets left out are kept.
    """
    for name in names:
        device_id = f"{host}:{name}"
        if labels is not None and name in labels:
            merged = {**labels.get("", {}), **labels[name]}
            _replace_labels(tx, device_id, LabelSource.DETECTED, merged)
        if declared is not None:
            merged = {**declared.get("", {}), **declared.get(name, {})}
            _replace_labels(tx, device_id, LabelSource.DECLARED, merged)
    if sheet is not None:
        tx.change("sheet_upsert", (host, "", sheet, tx.now))
    for name, body in device_sheets.items():
        if name in names:
            tx.change("sheet_upsert", (host, name, body, tx.now))


def _replace_labels(tx: Tx, device_id: str, source: LabelSource, values: dict[str, str]) -> None:
    old = {r["key"]: r["value"] for r in tx.all("labels_of", (device_id, source.value))}
    if old == values:
        tx.exec("labels_touch", (tx.now, device_id, source.value))  # each of them, maybe none
        return
    tx.exec("labels_delete", (device_id, source.value))  # every old one, maybe none
    tx.many("label_insert", [(device_id, k, v, source.value, tx.now) for k, v in values.items()])


def set_health(tx: Tx, device_id: str, value: str, match_cache: MatchCache) -> None:
    """Set the detected `health` label a device has to `value` (rc clear's
    fresh reading: the label need not wait for the next probe pass); a
    device without one is left as it is."""
    if tx.exec("label_set_detected", (value, tx.now, device_id, "health")):  # 0 or 1
        match_cache.invalidate()
        tx.notify("devices")


def set_links(tx: Tx, host: str, links: tuple[DeviceLink, ...]) -> None:
    """Replace a host's topology (the API checked every pair names two of its
    devices, once)."""
    old = {(r["a"], r["b"]): r["link"] for r in tx.all("device_links_of_host", (host,))}
    new = {tuple(sorted((lk.a, lk.b))): lk.link.value for lk in links}
    if old == new:
        return
    tx.exec("device_links_delete", (host,))  # every old pair, maybe none
    tx.many("device_link_insert", [(host, a, b, link) for (a, b), link in sorted(new.items())])


def device_names(tx: Tx, worker_id: str) -> set[str]:
    """The names of a worker's devices."""
    return {r["name"] for r in tx.all("devices_of_worker", (worker_id,))}


def relabel(tx: Tx, req: LabelsRequest, match_cache: MatchCache) -> None:
    """A worker's periodic re-probe (POST /v1/workers/{id}/labels): store the
    labels and sheets of `req.devices` (every device of the worker when
    empty; names it does not have are ignored), as set_labels does, and the
    host's topology when it sent one. Never touches jobs or device states.
    404 for a worker that never registered.
    """
    worker_id = req.host
    if tx.one("worker_get", (worker_id,)) is None:
        raise Refused(ErrorCode.NOT_FOUND, f"worker {worker_id} is not registered")
    known = {r["name"] for r in tx.all("devices_of_worker", (worker_id,))}
    names = tuple(n for n in req.devices if n in known) if req.devices else tuple(known)
    set_labels(tx, worker_id, names, req.labels, req.declared_labels, req.sheet, req.device_sheets)
    if req.links is not None:
        set_links(tx, worker_id, req.links)
    match_cache.invalidate()
    tx.schedule = True
    tx.notify("devices")
