"""GPU health (README "GPU health"): nvidia-smi's health CSV and the kernel
log as pure functions, every rule of health_rules.json against a fake
nvidia-smi and a fake kmsg file, unknown facts never healthy, episodes, the
baseline, and the prober's health label."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rc.worker import health, kernlog
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.labels import Prober
from tests.helpers.fake_nvidia_smi import FakeNvidiaSmi, kmsg_xid

RULES = health.load_rules()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = FakeNvidiaSmi(tmp_path / "bin", gpus=2)
    monkeypatch.setenv("PATH", f.path_env({"PATH": "/usr/bin:/bin"})["PATH"])
    return f


@pytest.fixture
def kmsg(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("6,1,1000,-;Linux version 6.1 (fake)\n")
    return path


def monitor(kmsg) -> health.Monitor:
    return health.Monitor(str(kmsg))


GPUS = {"gpu0": 0, "gpu1": 1}


# -- parsers ------------------------------------------------------------------------


def test_parse_readings_real_csv():
    fields = ("index", "pci.bus_id", "remapped_rows.pending", "power.draw", "utilization.gpu")
    text = (
        "0, 00000000:3B:00.0, No, 63.21, 0\n"
        "1, 00000000:5E:00.0, [N/A], [Not Supported], [Unknown Error]\n"
        "2, short line\n"
    )
    r = health.parse_readings(text, fields)
    assert r[0] == {
        "index": "0",
        "pci.bus_id": "00000000:3B:00.0",
        "remapped_rows.pending": "No",
        "power.draw": "63.21",
        "utilization.gpu": "0",
    }
    assert r[1]["remapped_rows.pending"] is None and r[1]["power.draw"] is None
    assert r[1]["utilization.gpu"] is None and 2 not in r


def test_normal_pci_matches_nvidia_smi_and_the_kernel():
    assert health.normal_pci("00000000:3B:00.0") == "0000:3b:00"
    assert health.normal_pci("0000:3b:00") == "0000:3b:00"
    assert health.normal_pci("garbage") == ""


def test_parse_kernel_log_kmsg_and_dmesg():
    text = (
        "3,812,5000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        "6,813,5000100,-;usb 1-1: new device\n"
        "[  123.456789] NVRM: Xid (PCI:0000:5e:00): 94, pid=77, Contained: SM (0x1).\n"
        "<4>[  200.000001] NVRM: Xid (0000:5e:00): 13, Graphics Exception\n"
    )
    a, b, c = health.parse_kernel_log(text)
    assert (a.key, a.at, a.pci, a.xid) == (812, 5.0, "0000:3b:00", 79)
    assert "fallen off the bus" in a.text
    assert (b.key, b.pci, b.xid) == (123.456789, "0000:5e:00", 94)
    assert (c.pci, c.xid) == ("0000:5e:00", 13)


@given(st.text(max_size=300))
def test_health_parsers_never_raise(text):
    health.parse_kernel_log(text)
    health.parse_readings(text, health.HEALTH_FIELDS)
    health.normal_pci(text)


def test_rules_file_is_valid_and_every_rule_names_its_source():
    assert RULES.facts and RULES.xids
    for r in RULES.facts:
        assert RULES.sources.get(r.source)
    for r in RULES.xids.values():
        assert r.source in RULES.sources
    with pytest.raises(health.RulesError, match="not JSON"):
        health.load_rules("{")
    with pytest.raises(health.RulesError, match="bad test"):
        health.load_rules(
            '{"sources": {"s": "x"}, "facts": [{"name": "n", "field": "f", "test": "odd",'
            ' "action": "fault", "why": "w", "source": "s"}]}'
        )


# -- each rule of the file -------------------------------------------------------------

FACT_CASES = {
    "ecc-uncorrected": ({"ecc.errors.uncorrected.volatile.total": "2"}, 1),
    "ecc-uncorrected-aggregate": ({"ecc.errors.uncorrected.aggregate.total": "5"}, 1),
    "row-remap-failed": ({"remapped_rows.failure": "Yes"}, 1),
    "row-remap-pending": ({"remapped_rows.pending": "Yes"}, 1),
    "pcie-width": ({"pcie.link.width.current": "8"}, 1),
    "pcie-gen": ({"pcie.link.gen.current": "3", "utilization.gpu": "97"}, 1),
    "hw-slowdown": ({"clocks_throttle_reasons.hw_slowdown": "Active"}, 3),
    "thermal": ({"clocks_throttle_reasons.hw_thermal_slowdown": "Active"}, 3),
    "power-brake": ({"clocks_throttle_reasons.hw_power_brake_slowdown": "Active"}, 3),
}


def test_every_fact_rule_has_a_case():
    assert set(FACT_CASES) == {r.name for r in RULES.facts}


@pytest.mark.parametrize("rule", sorted(FACT_CASES))
def test_fact_rule(rule, fake, kmsg):
    fields, passes = FACT_CASES[rule]
    expected = next(r for r in RULES.facts if r.name == rule)
    fake.set_gpu(1, **{k.replace(".", "__"): v for k, v in fields.items()})
    m = monitor(kmsg)
    for _ in range(passes - 1):  # sustained rules: not yet
        p = m.run(GPUS)
        assert p.labels["gpu1"]["health"] == "ok" and not p.actions
    p = m.run(GPUS)
    assert p.labels["gpu0"]["health"] == "ok"  # the other GPU is untouched
    got = p.labels["gpu1"]["health"]
    if expected.action == "baseline":
        assert got == "ok" and not p.actions
        assert "ecc_aggregate=5" in p.labels["gpu1"]["health_baseline"]
    else:
        assert got == f"{expected.action}:{rule}"
        acted = [(f.device, f.rule, f.action) for f in p.actions]
        if expected.action in ("fault", "drain"):
            assert acted == [("gpu1", rule, expected.action)]
            reason = p.actions[0].reason("box:gpu1")
            assert reason.startswith(f"health: {rule} on box:gpu1: {expected.why}")
            assert f"{expected.field if rule != 'pcie-gen' else ''}" in reason
            assert RULES.source(expected.source) in reason
        else:
            assert acted == []


@pytest.mark.parametrize("xid", sorted(RULES.xids))
def test_xid_rule(xid, fake, kmsg):
    rule = RULES.xids[xid]
    m = monitor(kmsg)
    assert m.run(GPUS).xids == []  # the first read is the baseline
    with open(kmsg, "a") as f:
        f.write(kmsg_xid(2, 9_000_000, 1, xid, "something happened"))
    p = m.run(GPUS)
    [f] = p.xids
    assert (f.device, f.rule, f.action, f.why) == ("gpu1", f"xid-{xid}", rule.action, rule.why)
    assert "something happened" in f.evidence and f.event.at == 9.0
    if rule.action in ("fault", "drain"):
        assert [a.rule for a in p.actions] == [f"xid-{xid}"]
    else:
        assert p.actions == []
    health_now = p.labels["gpu1"]["health"]
    assert health_now == (f"fault:xid-{xid}" if rule.action == "fault" else "ok")
    assert m.run(GPUS).xids == []  # an event is seen once


def test_xids_before_the_first_pass_are_the_baseline(fake, kmsg):
    kmsg.write_text(kmsg_xid(5, 1_000_000, 0, 79))
    m = monitor(kmsg)
    p = m.run(GPUS)
    assert p.actions == [] and p.labels["gpu0"]["health"] == "ok"
    assert "xids_before=79" in p.labels["gpu0"]["health_baseline"]
    assert "xids_before" not in p.labels["gpu1"]["health_baseline"]


def test_an_xid_of_another_gpu_of_the_host_is_ignored(fake, kmsg):
    m = monitor(kmsg)
    m.run({"gpu0": 0})
    with open(kmsg, "a") as f:
        f.write(kmsg_xid(9, 2_000_000, 1, 79))
    assert m.run({"gpu0": 0}).xids == []


# -- the judgement's edges ----------------------------------------------------------------


def test_link_generation_below_max_while_idle_is_not_degraded(fake, kmsg):
    fake.set_gpu(0, pcie__link__gen__current="1", utilization__gpu="0")
    m = monitor(kmsg)
    assert m.run(GPUS).labels["gpu0"]["health"] == "ok"
    fake.set_gpu(0, utilization__gpu="85")
    assert m.run(GPUS).labels["gpu0"]["health"] == "degraded:pcie-gen"
    fake.set_gpu(0, utilization__gpu="[N/A]")  # busy or not: nobody knows
    assert m.run(GPUS).labels["gpu0"]["health"] == "unknown:pcie-gen"


@pytest.mark.parametrize("value", ["[N/A]", "[Not Supported]", "[Unknown Error]", "", "maybe"])
def test_an_unreadable_field_is_never_healthy(value, fake, kmsg):
    fake.set_gpu(0, remapped_rows__failure=value)
    p = monitor(kmsg).run(GPUS)
    assert p.labels["gpu0"]["health"] == "unknown:row-remap-failed"
    assert p.labels["gpu1"]["health"] == "ok"


def test_retired_pages_stand_in_for_row_remaps_on_older_gpus(fake, kmsg):
    fake.set_gpu(0, remapped_rows__pending="[N/A]", retired_pages__pending="No")
    fake.set_gpu(1, remapped_rows__pending="[N/A]", retired_pages__pending="Yes")
    p = monitor(kmsg).run(GPUS)
    assert p.labels["gpu0"]["health"] == "ok"
    assert p.labels["gpu1"]["health"] == "drain:row-remap-pending"
    assert "retired_pages.pending=Yes" in p.actions[0].evidence


def test_a_failed_nvidia_smi_makes_every_gpu_unknown(fake, kmsg):
    fake.mode("broken")
    p = monitor(kmsg).run(GPUS)
    assert not p.read and not p.actions
    assert all(v["health"].startswith("unknown:") for v in p.labels.values())


def test_a_field_this_nvidia_smi_does_not_know_reads_unknown(fake, kmsg):
    fake.refuse("remapped_rows.pending", "remapped_rows.failure")
    fake.set_gpu(0, retired_pages__pending="No")  # an older GPU: retired pages, no remaps
    m = monitor(kmsg)
    p = m.run(GPUS)
    assert p.read
    assert p.labels["gpu0"]["health"] == "unknown:row-remap-failed"  # pending: retired pages
    assert "remapped_rows.pending" not in m.fields


def test_throttling_must_be_sustained_and_resets_when_it_stops(fake, kmsg):
    m = monitor(kmsg)
    fake.set_gpu(0, clocks_throttle_reasons__hw_slowdown="Active")
    assert [m.run(GPUS).labels["gpu0"]["health"] for _ in range(3)] == [
        "ok",
        "ok",
        "degraded:hw-slowdown",
    ]
    fake.set_gpu(0, clocks_throttle_reasons__hw_slowdown="Not Active")
    assert m.run(GPUS).labels["gpu0"]["health"] == "ok"
    fake.set_gpu(0, clocks_throttle_reasons__hw_slowdown="Active")
    assert m.run(GPUS).labels["gpu0"]["health"] == "ok"  # the streak starts again


def test_a_fact_is_acted_on_once_per_episode(fake, kmsg):
    m = monitor(kmsg)
    fake.set_gpu(0, remapped_rows__failure="Yes")
    assert [f.rule for f in m.run(GPUS).actions] == ["row-remap-failed"]
    assert m.run(GPUS).actions == []  # still there: not sent again
    fake.set_gpu(0, remapped_rows__failure="No")
    assert m.run(GPUS).labels["gpu0"]["health"] == "ok"
    fake.set_gpu(0, remapped_rows__failure="Yes")
    assert [f.rule for f in m.run(GPUS).actions] == ["row-remap-failed"]  # a new episode


def test_a_fault_still_there_is_sent_again_each_pass_a_drain_once(fake, kmsg):
    # a device cleared while its fault is there must be quarantined again:
    # the worker cannot know it was cleared, so it says the fault each pass
    m = monitor(kmsg)
    fake.set_gpu(0, remapped_rows__failure="Yes", remapped_rows__pending="Yes")
    p = m.run(GPUS)
    assert sorted(f.rule for f in p.actions) == ["row-remap-failed", "row-remap-pending"]
    assert p.standing == []
    p = m.run(GPUS)
    assert p.actions == []
    assert [(f.device, f.rule, f.action) for f in p.standing] == [
        ("gpu0", "row-remap-failed", "fault")
    ]  # the drain is not: an undrain (forced) holds
    fake.set_gpu(0, remapped_rows__failure="No")
    assert m.run(GPUS).standing == []


def test_check_reads_every_kind_so_an_unknown_fact_is_never_hidden(fake, kmsg):
    m = monitor(kmsg)
    fake.set_gpu(0, remapped_rows__pending="Yes", remapped_rows__failure="[Unknown Error]")
    fake.set_gpu(1, pcie__link__width__current="8")
    got = m.check(GPUS)
    assert got == {
        "gpu0": "drain:row-remap-pending unknown:row-remap-failed",
        "gpu1": "degraded:pcie-width",
    }
    assert m.run(GPUS).labels["gpu0"]["health"] == "drain:row-remap-pending"  # the label: the first
    fake.mode("broken")
    assert m.check(GPUS) == {"gpu0": "unreadable", "gpu1": "unreadable"}


def test_the_worst_finding_names_the_label(fake, kmsg):
    fake.set_gpu(0, pcie__link__width__current="4", remapped_rows__pending="Yes")
    assert monitor(kmsg).run(GPUS).labels["gpu0"]["health"] == "drain:row-remap-pending"
    fake.set_gpu(1, pcie__link__width__current="4", remapped_rows__failure="Yes")
    assert monitor(kmsg).run(GPUS).labels["gpu1"]["health"] == "fault:row-remap-failed"


def test_an_unreadable_kernel_log_falls_back_and_never_raises(fake, tmp_path):
    m = health.Monitor(str(tmp_path / "no-such-kmsg"))
    p = m.run(GPUS)  # dmesg, or nothing at all: the facts are still judged
    assert p.labels["gpu0"]["health"] == "ok"


# -- the prober ------------------------------------------------------------------------


def test_the_prober_labels_gpu_devices_with_their_health(tmp_path, fake, kmsg):
    cfg = WorkerConfig(
        host="box",
        devices=(DeviceConfig("gpu0"), DeviceConfig("gpu1"), DeviceConfig("cpu0")),
        probe_dir=str(tmp_path / "probe.d"),
        kernel_log=str(kmsg),
    )
    p = Prober(cfg)
    fake.set_gpu(1, pcie__link__width__current="8")
    res = p.run()
    assert res.labels["gpu0"]["health"] == "ok"
    assert res.labels["gpu1"]["health"] == "degraded:pcie-width"
    assert res.labels["gpu1"]["health_baseline"].startswith("degraded:pcie-width ecc_aggregate=0")
    assert res.labels["gpu1"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert "health" not in res.labels["cpu0"]
    fake.mode("broken")  # the labels are kept, but never as healthy
    res = p.run()
    assert res.labels["gpu0"]["health"] == "unknown:nvidia-smi"
    assert res.labels["gpu0"]["model"] == "NVIDIA A100-SXM4-80GB"


def test_an_xid_fault_stays_on_the_label_while_nvidia_smi_fails(tmp_path, fake, kmsg):
    cfg = WorkerConfig(
        host="box",
        devices=(DeviceConfig("gpu0"), DeviceConfig("gpu1")),
        probe_dir=str(tmp_path / "probe.d"),
        kernel_log=str(kmsg),
    )
    p = Prober(cfg)
    p.run()
    with open(kmsg, "a") as f:
        f.write(kmsg_xid(3, 2_000_000, 1, 48))
    assert p.run().labels["gpu1"]["health"] == "fault:xid-48"
    fake.mode("broken")  # a fault ranks before unknown (README "GPU health")
    res = p.run()
    assert res.labels["gpu1"]["health"] == "fault:xid-48"
    assert res.labels["gpu0"]["health"] == "unknown:nvidia-smi"


# -- the jobs an Xid hits ------------------------------------------------------------------


def test_job_note_names_the_xids_on_the_jobs_gpus_since_it_started():
    def found(device, xid, at):
        ev = health.XidEvent(at, at, "0000:10:00", xid, f"NVRM: Xid (PCI:0000:10:00): {xid}")
        return health.xid_finding(RULES, device, ev)

    hits = [
        found("gpu3", 79, 100.0),
        found("gpu3", 79, 101.0),  # the same words once
        found("gpu3", 13, 102.0),
        found("gpu1", 48, 103.0),  # another GPU: not this job's
        found("gpu3", 95, 10.0),  # before the job started
    ]
    note = health.job_note(hits, "box", ["gpu3"], since=50.0)
    assert note.text == (
        "cause: hardware (Xid 79 on box:gpu3: GPU has fallen off the bus); "
        "Xid 13 on box:gpu3: graphics engine exception (the application's own)"
    )
    assert note.hardware == "Xid 79 on box:gpu3: GPU has fallen off the bus"
    assert note.faulty == ("gpu3",)
    assert health.job_note(hits, "box", ["gpu0"], since=0.0) == health.JobNote()
    own = health.job_note([found("gpu3", 13, 60.0)], "box", ["gpu3"], since=50.0)
    assert own.hardware == "" and own.faulty == ()  # the application's own: no cause


def test_poll_xids_reads_between_passes_and_the_next_pass_does_not_repeat_them(fake, kmsg):
    m = monitor(kmsg)
    m.run(GPUS)
    with open(kmsg, "a") as f:
        f.write(kmsg_xid(7, 3_000_000, 0, 79))
    [f] = m.poll_xids()
    assert (f.device, f.action) == ("gpu0", "fault") and list(m.recent) == [f]
    p = m.run(GPUS)
    assert p.xids == [] and p.actions == []
    assert p.labels["gpu0"]["health"] == "fault:xid-79"


def test_the_kernel_log_is_read_on_from_where_it_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(kernlog, "KERNEL_LOG_CAP", 150)  # a record or two per pass
    monkeypatch.setattr(kernlog, "READ_BYTES", 50)  # lines cut across reads
    path = tmp_path / "kmsg"
    path.write_text("".join(kmsg_xid(i, i * 1000, 0, 13) for i in range(1, 6)))
    log = health.KernelLog(str(path))
    assert log.read() == []  # the baseline is read whole, however long
    assert [e.key for e in log.baseline] == [1, 2, 3, 4, 5]
    seen = []
    with open(path, "a") as f:
        f.write("".join(kmsg_xid(i, i * 1000, 0, 79) for i in range(6, 10)))
    for _ in range(10):
        seen += log.read()
    assert [e.key for e in seen] == [6, 7, 8, 9] and {e.xid for e in seen} == {79}


def test_the_xids_that_hit_a_job_are_read_on_the_clock_its_start_came_from(tmp_path, fake, kmsg):
    """A job's start (JobRun.started_at, wall time of the worker's clock) is
    mapped onto the kernel log's seconds since boot through that same
    clock. Found by a review: the mapping took the job's start from the
    worker's clock but "now" from the real one, so under a fake clock every
    Xid since boot counted as the job's."""
    from types import SimpleNamespace

    from rc.proto.model import JobState
    from rc.worker.ending import SINCE_SLACK_S, Endings, kernel_since
    from rc.worker.hooks import Leases
    from rc.worker.launch import Result
    from rc.worker.runs import Runs
    from tests.helpers.fakeclock import START_MONOTONIC, FakeClock

    clock = FakeClock()
    cfg = WorkerConfig(
        host="box",
        devices=(DeviceConfig("gpu0"),),
        probe_dir=str(tmp_path / "probe.d"),
        kernel_log=str(kmsg),
    )
    prober = Prober(cfg, clock=clock)
    prober.run()  # the kernel log's baseline, the GPUs' PCI addresses
    reports, faults = [], []

    class Reports:  # the worker's reporter: only what it is handed matters here
        def submit(self, report):
            reports.append(report)

        def submit_health(self, checked, job_id=None):
            faults.extend((f.rule, job_id) for f in checked.actions)

    ending = Endings("box", clock, Runs(), Reports(), prober, Leases(cfg, clock))
    run = SimpleNamespace(
        job_id=7, device_names=["gpu0"], started_at=clock.time(), release_epochs={}, sink=None
    )
    clock.advance(100)  # the job ran from kernel second 1000 to 1100
    assert kernel_since(clock, run.started_at) == START_MONOTONIC - SINCE_SLACK_S
    assert kernel_since(clock, None) == START_MONOTONIC + 100 - SINCE_SLACK_S
    with open(kmsg, "a") as f:
        f.write(kmsg_xid(2, 900_000_000, 0, 48))  # before the job started, read only now
        f.write(kmsg_xid(3, 1_050_000_000, 0, 13))  # while it ran
    ending.finished(run, Result(JobState.FAILED, 1, "exit code 1"))
    [r] = reports
    assert (r.job_id, r.state, r.hardware_cause, r.hardware_device_ids) == (7, "failed", "", ())
    assert r.reason == (
        "exit code 1; Xid 13 on box:gpu0: graphics engine exception (the application's own)"
    )
    assert faults == [("xid-48", 7)]  # the fault still goes out, naming the job that ended
