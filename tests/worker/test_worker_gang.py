"""The worker's side of jobs on several devices (README "Several devices
for one job"): `nvidia-smi topo -m` parsed on captured text, the topology a
probe pass reports (with a fake nvidia-smi), a job's environment, and the
teardown and verify of every device of a job (real processes, a JobContext
whose faults go to a list)."""

from __future__ import annotations

import dataclasses
import queue
import uuid

from hypothesis import given
from hypothesis import strategies as st

from rc.proto.model import JobKind, Link
from rc.proto.wire import Assignment, DeviceLink
from rc.worker import leftovers, nvidia
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.job import JobContext, JobRun
from rc.worker.labels import Prober
from rc.worker.launch import Result, job_env
from rc.worker.probe import cuda_visible
from tests.helpers.fake_nvidia_smi import QUADS, FakeNvidiaSmi
from tests.helpers.fakeclock import FakeClock
from tests.helpers.harness import REPO

DATA = REPO / "tests" / "data"


# ---------------------------------------------------------------- topo -m, captured


def test_two_nvlink_quads_with_nic_columns_escapes_and_the_legend():
    t = nvidia.parse_topology((DATA / "topo_8gpu_two_nvlink_quads.txt").read_text())
    assert len(t.links) == 28
    assert {t.links[(i, j)] for i in range(4) for j in range(i + 1, 4)} == {Link.NV}
    assert {t.links[(i, j)] for i in range(4, 8) for j in range(i + 1, 8)} == {Link.NV}
    assert {t.links[(i, j)] for i in range(4) for j in range(4, 8)} == {Link.SYS}
    assert t.numa == {0: "0", 1: "0", 2: "0", 3: "0", 4: "1", 5: "1", 6: "1", 7: "1"}


def test_four_gpus_in_pcie_pairs_across_two_sockets():
    t = nvidia.parse_topology((DATA / "topo_4gpu_pix_sys.txt").read_text())
    assert t.links == {
        (0, 1): Link.PIX,
        (2, 3): Link.PIX,
        (0, 2): Link.SYS,
        (0, 3): Link.SYS,
        (1, 2): Link.SYS,
        (1, 3): Link.SYS,
    }
    assert t.numa == {0: "0", 1: "0", 2: "1", 3: "1"}


def test_odd_cells_are_unknown_or_their_older_names():
    t = nvidia.parse_topology((DATA / "topo_3gpu_odd_cells.txt").read_text())
    # SOC is what older drivers called SYS; WEIRD is unknown, and the two rows
    # of a pair that disagree give the worse of their two links
    assert t.links == {(0, 1): Link.NODE, (0, 2): Link.SYS, (1, 2): Link.UNKNOWN}
    assert t.numa == {2: "1"}  # N/A is no NUMA node


def test_link_classes():
    assert [nvidia.link_class(c) for c in ("NV1", "NV18", "nv4", "PIX", "PXB", "PHB")] == [
        Link.NV,
        Link.NV,
        Link.NV,
        Link.PIX,
        Link.PXB,
        Link.PHB,
    ]
    assert [nvidia.link_class(c) for c in ("NODE", "SYS", "SOC", "X", "", "NVLINK")] == [
        Link.NODE,
        Link.SYS,
        Link.SYS,
        Link.UNKNOWN,
        Link.UNKNOWN,
        Link.UNKNOWN,
    ]


def test_garbage_is_no_topology_never_an_error():
    for text in ("", "NVIDIA-SMI has failed", "GPU0\nGPU1 X\n", "\t\x1b[4mGPU0\tGPU1\x1b[0m\n"):
        assert nvidia.parse_topology(text) == nvidia.Topology()


@given(st.text(max_size=400))
def test_the_topology_parser_never_raises(text):
    nvidia.parse_topology(text)


# ---------------------------------------------------------------- a probe pass


def prober(tmp_path, *names: str) -> Prober:
    return Prober(
        WorkerConfig(
            host="box",
            devices=tuple(DeviceConfig(n) for n in names),
            probe_dir=str(tmp_path / "probe.d"),
        )
    )


def test_a_pass_reports_every_pair_of_gpu_devices_and_their_numa_nodes(tmp_path, monkeypatch):
    fake = FakeNvidiaSmi(tmp_path / "bin", gpus=8, topo=QUADS)
    monkeypatch.setenv("PATH", fake.path_env({"PATH": "/usr/bin:/bin"})["PATH"])
    names = [f"gpu{i}" for i in range(8)] + ["cpu0"]
    res = prober(tmp_path, *names).run()
    links = {(lk.a, lk.b): lk.link for lk in res.links}
    assert len(links) == 28  # the GPU devices' pairs; cpu0 has no topology
    assert links[("gpu0", "gpu3")] is Link.NV and links[("gpu3", "gpu4")] is Link.SYS
    assert res.labels["gpu5"]["numa"] == "1" and "numa" not in res.labels["cpu0"]


def test_an_unreadable_topology_is_unknown_then_kept(tmp_path, monkeypatch):
    fake = FakeNvidiaSmi(tmp_path / "bin", gpus=2, topo="no matrix here\n")
    monkeypatch.setenv("PATH", fake.path_env({"PATH": "/usr/bin:/bin"})["PATH"])
    p = prober(tmp_path, "gpu0", "gpu1")
    assert p.run().links == (DeviceLink("gpu0", "gpu1", Link.UNKNOWN),)
    fake.set_topo(QUADS)  # the pass reads what the driver says now
    assert p.run().links == (DeviceLink("gpu0", "gpu1", Link.NV),)
    fake.set_topo("")  # once read, a failure says nothing: the controller keeps it
    assert p.run().links is None
    fake.mode("broken")
    assert p.run().links is None


def test_fewer_than_two_gpus_have_no_pairs(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all
    assert prober(tmp_path, "gpu0", "cpu0", "cpu1").run().links == ()


# ---------------------------------------------------------------- a job's environment


def test_a_job_sees_its_devices_in_the_order_chosen():
    env = job_env({"RC_TOKEN": "secret"}, {"A": "1"}, 7, ("box:gpu3", "box:gpu1"), "3,1")
    assert env["RC_DEVICES"] == "box:gpu3,box:gpu1" and env["RC_DEVICE"] == "box:gpu3"
    assert env["RC_COUNT"] == "2" and env["RC_JOB_ID"] == "7"
    assert env["CUDA_VISIBLE_DEVICES"] == "3,1" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "RC_TOKEN" not in env and env["A"] == "1"
    cpu = job_env({}, {}, 8, ("box:cpu0", "box:cpu2", "box:cpu1"), "")
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and "CUDA_DEVICE_ORDER" not in cpu
    assert cpu["RC_DEVICES"] == "box:cpu0,box:cpu2,box:cpu1" and cpu["RC_COUNT"] == "3"


def test_cuda_visible_devices_of_a_device_list():
    assert cuda_visible(["gpu3", "gpu1", "gpu10"]) == "3,1,10"
    assert cuda_visible(["cpu0", "cpu1"]) == ""
    assert cuda_visible(["gpu0", "fpga"]) is None  # a device with no index: no variable


def test_leftovers_fault_one_device_or_all_of_them():
    ids = ("box:gpu0", "box:gpu1", "box:gpu2")
    on_gpu = {"box:gpu1": "GPU GPU-1 still has compute processes: pid 9 'python'"}
    assert leftovers.device_faults(ids, "", on_gpu) == on_gpu
    tagged = "processes of job 7 survived teardown: pid 12 'sleep 300'"
    got = leftovers.device_faults(ids, tagged, on_gpu)
    assert got == {
        "box:gpu0": tagged,
        "box:gpu1": f"{tagged}; {on_gpu['box:gpu1']}",
        "box:gpu2": tagged,
    }
    assert leftovers.device_faults(ids, "", {}) == {}


# ---------------------------------------------------------------- a run on three devices


def _context(tmp_path, faults, results, uuids=None) -> JobContext:
    return JobContext(
        cfg=WorkerConfig(  # every job as this process's own user ("alice" has no account here)
            host="box",
            kill_grace=0.5,
            verify_dir=str(tmp_path / "verify.d"),
            verify_timeout=10,
            shared_account=True,
        ),
        clock=FakeClock(),
        client=None,
        markers={"RC_HOST": "box", "RC_WORKER_INSTANCE": uuid.uuid4().hex},
        report=lambda r: None,
        fault=lambda *f: faults.append(f),
        open_log=lambda job_id: _Sink(),
        hooks=lambda name: None,
        gpu_uuid=lambda name: (uuids or {}).get(name, ""),
        stopping=lambda: False,
        finished=lambda run, result: results.put(result),
    )


class _Sink:
    data = b""

    def write(self, data: bytes) -> None:
        _Sink.data += data

    def close(self, timeout: float, hand_off: bool = False) -> bool:
        return True


def test_every_device_of_a_job_is_verified_and_only_a_failing_one_faulted(tmp_path):
    verify = tmp_path / "verify.d"
    verify.mkdir()
    script = verify / "10-check"
    script.write_text(
        '#!/bin/sh\necho "$RC_DEVICE" >> "$0.seen"\n'
        '[ "$RC_DEVICE" = box:gpu2 ] && { echo "ECC errors" >&2; exit 1; }\nexit 0\n'
    )
    script.chmod(0o755)
    faults: list[tuple] = []
    results: queue.Queue[Result] = queue.Queue()
    a = Assignment(
        job_id=7,
        device_id="box:gpu2",
        device_ids=("box:gpu2", "box:gpu0", "box:gpu1"),
        kind=JobKind.JOB,
        command=("sh", "-c", 'echo "$RC_DEVICES $RC_COUNT $CUDA_VISIBLE_DEVICES"'),
        cwd="",
        env={},
        submitter="alice",
    )
    _Sink.data = b""
    run = JobRun(_context(tmp_path, faults, results), a, [None, None, None])
    run.start()
    result = results.get(timeout=30)
    assert result.exit_code == 0
    assert _Sink.data == b"box:gpu2,box:gpu0,box:gpu1 3 2,0,1\n"
    seen = (verify / "10-check.seen").read_text().split()
    assert seen == ["box:gpu2", "box:gpu0", "box:gpu1"]
    assert [(d, j) for d, _, j in faults] == [("box:gpu2", 7)]
    assert faults[0][1].startswith("verify failed: 10-check: ") and "ECC errors" in faults[0][1]


def test_a_compute_process_left_on_one_gpu_faults_that_device_alone(tmp_path, monkeypatch):
    fake = FakeNvidiaSmi(tmp_path / "bin", gpus=2)
    monkeypatch.setenv("PATH", fake.path_env({"PATH": "/usr/bin:/bin"})["PATH"])
    fake.add_app(1, 4242, "python train.py")
    faults: list[tuple] = []
    results: queue.Queue[Result] = queue.Queue()
    a = Assignment(
        job_id=8,
        device_id="box:gpu0",
        device_ids=("box:gpu0", "box:gpu1"),
        kind=JobKind.JOB,
        command=("true",),
        cwd="",
        env={},
        submitter="alice",
    )
    uuids = {"gpu0": "GPU-fake-0", "gpu1": "GPU-fake-1"}
    run = JobRun(_context(tmp_path, faults, results, uuids), a, [None, None])
    run.start()
    results.get(timeout=30)  # after the GPU check's settle time (5 s)
    assert [(d, j) for d, _, j in faults] == [("box:gpu1", 8)]
    assert "GPU GPU-fake-1 still has compute processes: pid 4242 'python train.py'" in faults[0][1]


def test_a_run_takes_the_lowest_ceiling_of_its_devices(tmp_path):
    a = Assignment(
        job_id=9,
        device_id="box:cpu0",
        device_ids=("box:cpu0", "box:cpu1", "box:cpu2"),
        kind=JobKind.JOB,
        command=("true",),
        cwd="",
        env={},
        submitter="alice",
    )
    configs = [DeviceConfig("cpu0", max_runtime=0), DeviceConfig("cpu1", max_runtime=900), None]
    run = JobRun(_context(tmp_path, [], queue.Queue()), a, configs)
    assert run.limits(False).max_runtime == 900
    longer = dataclasses.replace(a, max_runtime_seconds=3600)
    run = JobRun(_context(tmp_path, [], queue.Queue()), longer, configs)
    assert run.limits(False).max_runtime == 900


@given(st.lists(st.sampled_from(["GPU0", "GPU1", "GPU2", "X", "NV4", "SYS", "NIC0", "\t", "\n"])))
def test_the_topology_parser_never_raises_on_matrix_like_text(words):
    nvidia.parse_topology("\tGPU0\tGPU1\n" + " ".join(words))
