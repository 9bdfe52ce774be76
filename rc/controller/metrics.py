"""Prometheus metrics of one controller, served by GET /metrics
(rc.controller.api.metrics).

Each Controller owns one `Metrics` with its own CollectorRegistry (never the
process-global one, so two controllers in one process never mix series).

Where each series comes from:

- the store, counted on every scrape (rc.controller.store.views.census)
  inside one read transaction on a reader thread (a consistent snapshot; the writer and the
  event loop never wait for it): devices by state, quarantined devices by
  reason, draining devices, queue depth by priority, jobs by state (finished
  ones as counters), feed events by kind, heartbeat age per worker. The jobs
  count is one pass over the jobs table per scrape;
- memory: the submit→start latency histogram, observed after the commit of
  the report that started a job (see `observe_starts`), so since this
  controller process started;
- the log directory: bytes and files stored under DATA/logs, from a scan
  that is reused for LOG_SCAN_REUSE times as long as it took (so a small
  directory is always fresh and a huge one costs a bounded share of a thread);
- hooks other parts of the controller set, zero-argument callables returning
  a number, each defaulting to 0: `relay_sessions` (open relay sessions),
  `webhook_dropped` (webhook events dropped, a running total) and
  `sse_subscribers` (set by rc.controller.api.stream). A hook that raises is
  logged and its series left out of that scrape.

Access: /metrics needs a token of any role (user, worker or admin), like
every other route but the dashboard page: the series name hosts and carry
the fleet's shape. Prometheus sends one with `authorization: {credentials_file: ...}`.

A Metrics knows the database and the log directory, not the Controller
(which owns it): rc.controller.core imports this module, never the reverse.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from rc import __version__
from rc.controller.store import usage, views
from rc.controller.store.db import Database, Tx
from rc.proto.model import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    DeviceState,
    EventKind,
    JobState,
    QuarantineReason,
)

__all__ = ["HOOKS", "START_LATENCY_BUCKETS_S", "Metrics", "StoreCollector"]

log = logging.getLogger("rc.metrics")

START_LATENCY_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    14400.0,
    86400.0,
)
"""Histogram buckets of rc_job_start_latency_seconds, in seconds: from the
idle-device target (README "Performance": ≤ 10 ms) up to a day in the queue."""

LOG_SCAN_REUSE = 20.0
"""A log-directory scan that took t seconds is reused for LOG_SCAN_REUSE·t seconds."""

HOOKS = ("relay_sessions", "webhook_dropped", "sse_subscribers")
"""Attribute names of the hook callables on Metrics."""

UNKNOWN_REASON = "unknown"
"""The `reason` label value of a quarantine whose cause is unknown ('' in the store)."""


REQUEST_SIDES = ("worker", "client")
WORKER_PREFIX = "/v1/workers/"


def _zero() -> float:
    return 0.0


class Metrics:
    """The metrics of one controller: its registry, histogram and hooks.

    Others plug in by assigning a hook, for example
    `ctl.metrics.relay_sessions = lambda: len(relay.sessions)`.
    """

    def __init__(self, db: Database, log_dir: Path) -> None:
        self.db = db
        self.log_dir = log_dir
        self.registry = CollectorRegistry(auto_describe=False)
        self.start_latency = Histogram(
            "rc_job_start_latency_seconds",
            "Seconds from a job's submission to its process start (jobs started since "
            "this controller process started; holds included)",
            buckets=START_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "rc_queue_wait_seconds",
            "Seconds a job or hold waited in the queue before the scheduling pass granted "
            "it devices (grants since this controller process started)",
            buckets=START_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.relay_sessions: Callable[[], float] = _zero
        self.webhook_dropped: Callable[[], float] = _zero
        self.sse_subscribers: Callable[[], float] = _zero
        self.requests = {side: 0 for side in REQUEST_SIDES}
        """HTTP requests served since this process started, by side:
        "worker" (the /v1/workers/ routes) or "client" (every other);
        counted by `count_request`."""
        self.log_uploads = 0
        """POST /v1/jobs/{id}/logs uploads stored since this process started."""
        self.log_tails = 0
        """Log tails stored from reports (JobReport.log_tail) since then."""
        self.collector = StoreCollector()
        self.registry.register(self.collector)
        self._render_lock = threading.Lock()
        self._log_scan: tuple[float, int, int] | None = None  # (reuse until, bytes, files)

    def count_request(self, path: str) -> None:
        """Count one HTTP request for `path` on its side (see `requests`)."""
        self.requests["worker" if path.startswith(WORKER_PREFIX) else "client"] += 1

    def observe_starts(self, latencies: Iterable[float]) -> None:
        """Record jobs' submit→start latencies in seconds (called after the
        commit that started them; negative clock skew counts as 0)."""
        for seconds in latencies:
            self.start_latency.observe(max(0.0, seconds))

    def observe_wait(self, seconds: float) -> None:
        """Record one grant's wait in the queue, in seconds (a clock that went
        back counts 0). Thread-safe: the scheduling pass calls it."""
        self.queue_wait.observe(max(0.0, seconds))

    def hook_values(self) -> dict[str, float]:
        """Each hook's current value (called on the event loop); a failing hook is left out."""
        out = {}
        for name in HOOKS:
            try:
                out[name] = float(getattr(self, name)())
            except Exception:
                log.exception("metrics hook %s failed; leaving it out of this scrape", name)
        return out

    def log_usage(self) -> tuple[int, int]:
        """(bytes, files) stored under the log directory (blocking: run it off the loop)."""
        now = time.monotonic()
        cached = self._log_scan
        if cached is not None and now < cached[0]:
            return cached[1], cached[2]
        total = files = 0
        try:
            with os.scandir(self.log_dir) as it:
                for entry in it:
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                            files += 1
                    except FileNotFoundError:
                        continue
        except FileNotFoundError:
            pass
        took = time.monotonic() - now
        self._log_scan = (now + took * LOG_SCAN_REUSE, total, files)
        return total, files

    async def render(self) -> bytes:
        """The exposition text of every series, from one consistent store snapshot."""
        extra = self.hook_values()
        for side, n in self.requests.items():
            extra[f"requests_{side}"] = float(n)
        extra["log_uploads"], extra["log_tails"] = float(self.log_uploads), float(self.log_tails)
        extra["log_bytes"], extra["log_files"] = await asyncio.to_thread(self.log_usage)
        return await self.db.read(self._render, extra)

    def _render(self, tx: Tx, extra: dict[str, float]) -> bytes:
        # Runs on a reader thread; the lock keeps two scrapes on two readers
        # from sharing the collector's per-scrape context.
        counted = views.census(tx)
        extra_series = {"device_seconds": usage.device_seconds_by_user(tx)}
        with self._render_lock:
            self.collector.context = (counted, extra, extra_series)
            try:
                return generate_latest(self.registry)
            finally:
                self.collector.context = None


class StoreCollector:
    """A custom collector: every series that is a fact of the store.

    `context` is (the store's census, extra values) during a scrape and None
    otherwise (then it yields nothing).
    """

    def __init__(self) -> None:
        self.context: tuple[views.Census, dict[str, float], dict] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.context is None:
            return
        counted, extra, series = self.context
        yield from _device_seconds(series["device_seconds"])
        yield from _devices(counted)
        yield from _jobs(counted)
        yield from _workers(counted)
        yield from _events(counted)
        yield from _extras(extra)


def _counts(found: dict, keys) -> dict:
    """{key: n} with every key present (0 where `found` has none)."""
    out = dict.fromkeys(keys, 0)
    out.update(found)
    return out


def _labelled(cls, name: str, doc: str, label: str, counts: dict) -> Metric:
    family = cls(name, doc, labels=[label])
    for key, n in counts.items():
        family.add_metric([str(key)], n)
    return family


def _device_seconds(by_user: dict[str, float]) -> Iterator[Metric]:
    c = CounterMetricFamily(
        "rc_device_seconds",
        "Device-seconds held by each user, jobs and holds (one lease per device), "
        "from the store's leases",
        labels=["user"],
    )
    for user, seconds in sorted(by_user.items()):
        c.add_metric([user], seconds)
    yield c


def _devices(counted: views.Census) -> Iterator[Metric]:
    states = _counts(counted.devices_by_state, (s.value for s in DeviceState))
    yield _labelled(
        GaugeMetricFamily, "rc_devices", "Devices by state (ready = free)", "state", states
    )
    reasons = _counts(counted.quarantined_by_reason, (q.value for q in QuarantineReason))
    reasons[UNKNOWN_REASON] = reasons.pop("")
    yield _labelled(
        GaugeMetricFamily,
        "rc_devices_quarantined",
        "Quarantined (unhealthy) devices by reason",
        "reason",
        reasons,
    )
    yield GaugeMetricFamily("rc_devices_draining", "Devices being drained", value=counted.draining)


def _jobs(counted: views.Census) -> Iterator[Metric]:
    depth = _counts(counted.queued_by_priority, range(PRIORITY_MIN, PRIORITY_MAX + 1))
    yield _labelled(
        GaugeMetricFamily, "rc_queue_depth", "Queued jobs by priority", "priority", depth
    )
    states = _counts(counted.jobs_by_state, (s.value for s in JobState))
    yield _labelled(
        GaugeMetricFamily,
        "rc_jobs",
        "Jobs not yet finished, by state",
        "state",
        {s.value: states[s.value] for s in JobState if not s.terminal},
    )
    yield _labelled(
        CounterMetricFamily,
        "rc_jobs_finished",
        "Jobs that ended, by terminal state",
        "state",
        {s.value: states[s.value] for s in JobState if s.terminal},
    )


def _workers(counted: views.Census) -> Iterator[Metric]:
    g = GaugeMetricFamily(
        "rc_worker_heartbeat_age_seconds",
        "Seconds since each worker's last heartbeat (controller clock)",
        labels=["worker"],
    )
    for worker_id, age in counted.heartbeat_age.items():
        g.add_metric([worker_id], age)
    yield g


def _events(counted: views.Census) -> Iterator[Metric]:
    kinds = _counts(counted.events_by_kind, (k.value for k in EventKind))
    yield _labelled(CounterMetricFamily, "rc_events", "Activity feed events by kind", "kind", kinds)


def _extras(extra: dict[str, float]) -> Iterator[Metric]:
    info = GaugeMetricFamily("rc_info", "This controller's version", labels=["version"])
    info.add_metric([__version__], 1)
    yield info
    counts = {
        side: extra[f"requests_{side}"] for side in REQUEST_SIDES if f"requests_{side}" in extra
    }
    if counts:
        yield _labelled(
            CounterMetricFamily,
            "rc_http_requests",
            "HTTP requests served since this controller process started, by side "
            "(worker: the /v1/workers/ routes; client: every other)",
            "side",
            counts,
        )
    if "log_uploads" in extra:
        yield CounterMetricFamily(
            "rc_log_uploads",
            "Log uploads (POST /v1/jobs/{id}/logs) stored since this controller process started",
            value=extra["log_uploads"],
        )
        yield CounterMetricFamily(
            "rc_log_tails",
            "Log tails carried by job reports and stored since this controller process started",
            value=extra["log_tails"],
        )
    if "log_bytes" in extra:
        yield GaugeMetricFamily(
            "rc_log_bytes", "Bytes of job logs stored", value=extra["log_bytes"]
        )
        yield GaugeMetricFamily("rc_log_files", "Job log files stored", value=extra["log_files"])
    if "relay_sessions" in extra:
        yield GaugeMetricFamily(
            "rc_relay_sessions", "Open relay (tty/pipe) sessions", value=extra["relay_sessions"]
        )
    if "webhook_dropped" in extra:
        yield CounterMetricFamily(
            "rc_webhook_dropped",
            "Webhook events dropped (queue full or delivery given up)",
            value=extra["webhook_dropped"],
        )
    if "sse_subscribers" in extra:
        yield GaugeMetricFamily(
            "rc_sse_subscribers",
            "Open live-update streams (GET /v1/events/stream)",
            value=extra["sse_subscribers"],
        )
