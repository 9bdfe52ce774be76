"""GET /metrics: Prometheus text, parsed with prometheus_client's own
parser and checked against the store; the hooks others plug into; access."""

from __future__ import annotations

import logging

import pytest

from rc.controller.config import ControllerConfig
from rc.controller.core import Controller as InProcessController
from rc.controller.metrics import START_LATENCY_BUCKETS_S
from tests.helpers.scrape import parse, run_in_process, value


def test_empty_store_gives_every_series_at_zero(tmp_path):
    async def body(ctl):
        return parse((await ctl.metrics.render()).decode())

    m = run_in_process(tmp_path, body)
    for state in ("ready", "busy", "unknown", "unhealthy"):
        assert value(m, "rc_devices", state=state) == 0
    for reason in ("fault", "worker_lost", "lease_expired", "registration", "unknown"):
        assert value(m, "rc_devices_quarantined", reason=reason) == 0
    assert [value(m, "rc_queue_depth", priority=str(p)) for p in range(-10, 11)] == [0] * 21
    for state in ("succeeded", "failed", "killed", "lost"):
        assert value(m, "rc_jobs_finished_total", state=state) == 0
    for state in ("queued", "assigned", "running"):
        assert value(m, "rc_jobs", state=state) == 0
    assert value(m, "rc_job_start_latency_seconds_count") == 0
    assert value(m, "rc_log_bytes") == 0
    assert value(m, "rc_relay_sessions") == 0
    assert value(m, "rc_webhook_dropped_total") == 0
    assert value(m, "rc_events_total", kind="token_created") == 1  # the bootstrap admin token
    assert value(m, "rc_http_requests_total", side="worker") == 0
    assert value(m, "rc_http_requests_total", side="client") == 0


def test_http_requests_are_counted_by_side(tmp_path):
    async def body(ctl):
        for path in ("/v1/workers/box/heartbeat", "/v1/workers/box/assignments", "/v1/jobs"):
            ctl.metrics.count_request(path)
        return parse((await ctl.metrics.render()).decode())

    m = run_in_process(tmp_path, body)
    assert value(m, "rc_http_requests_total", side="worker") == 2
    assert value(m, "rc_http_requests_total", side="client") == 1


def test_hooks_report_what_others_plug_in_and_a_broken_one_is_left_out(tmp_path, caplog):
    async def body(ctl):
        ctl.metrics.relay_sessions = lambda: 3
        ctl.metrics.webhook_dropped = lambda: 7
        ctl.metrics.sse_subscribers = lambda: 1 / 0
        return parse((await ctl.metrics.render()).decode())

    with caplog.at_level(logging.ERROR, logger="rc.metrics"):
        m = run_in_process(tmp_path, body)
    assert value(m, "rc_relay_sessions") == 3
    assert value(m, "rc_webhook_dropped_total") == 7
    assert not any(name == "rc_sse_subscribers" for name, _ in m)
    assert "sse_subscribers failed" in caplog.text


def test_start_latency_histogram_buckets_and_clock_skew(tmp_path):
    async def body(ctl):
        ctl.metrics.observe_starts([0.003, 2.0, -1.0])
        return parse((await ctl.metrics.render()).decode())

    m = run_in_process(tmp_path, body)
    assert value(m, "rc_job_start_latency_seconds_count") == 3
    assert value(m, "rc_job_start_latency_seconds_sum") == pytest.approx(2.003)
    assert value(m, "rc_job_start_latency_seconds_bucket", le="0.005") == 2  # skew counts as 0
    assert value(m, "rc_job_start_latency_seconds_bucket", le="2.5") == 3
    assert value(m, "rc_job_start_latency_seconds_bucket", le="+Inf") == 3
    assert (
        len(START_LATENCY_BUCKETS_S)
        == len([k for k in m if k[0] == "rc_job_start_latency_seconds_bucket"]) - 1
    )


def test_two_controllers_never_share_series(tmp_path):
    async def body(ctl):
        other = InProcessController(ControllerConfig(data_dir=str(tmp_path / "other")))
        ctl.metrics.observe_starts([1.0])
        assert other.metrics.registry is not ctl.metrics.registry
        return parse((await ctl.metrics.render()).decode())

    assert value(run_in_process(tmp_path, body), "rc_job_start_latency_seconds_count") == 1
