"""Jobs and holds on several devices of one host, end to end (README
"Several devices for one job"): a real controller, workers from the zipapp
(CPU devices, and 8 fake GPUs with a fake `nvidia-smi topo -m`), the real
CLI."""

from __future__ import annotations

import json

import pytest

from rc.proto.errors import ApiError
from tests.helpers.fake_nvidia_smi import QUADS, FakeNvidiaSmi
from tests.helpers.harness import job
from tests.helpers.wait import wait_until

SHOW = (
    "import os; print(os.environ['RC_DEVICES'], os.environ['RC_DEVICE'], "
    "os.environ['RC_COUNT'], repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
)


@pytest.fixture
def four(controller, make_worker):
    return make_worker(controller, host="box", devices="cpu:4")


def test_run_n_3_sees_three_distinct_devices(four, cli):
    res = cli.run("run", "-n", "3", "--", "python3", "-c", SHOW)
    assert res.returncode == 0, res.stderr
    devices, first, count, cuda = res.stdout.decode().split()
    got = devices.split(",")
    assert len(set(got)) == 3 and all(d.startswith("box:cpu") for d in got)
    assert first == got[0] and count == "3" and cuda == "''"
    assert b" on box:cpu" in res.stderr  # "job 7 on box:cpu0..2"


def test_a_pinned_list_runs_in_the_order_given(four, cli):
    res = cli.run("run", "-d", "box:cpu3,cpu1", "--", "python3", "-c", SHOW)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().split()[:3] == ["box:cpu3,box:cpu1", "box:cpu3", "2"]


def test_a_wide_job_waits_behind_a_hold_and_runs_when_it_is_released(four, cli, controller):
    hold = cli.run(
        "hold", "-d", "box:cpu1", "--ttl", "1h", "--reason", "in the way", "--detach", check=True
    )
    hold_id = int(hold.stdout)
    res = cli.run("run", "-n", "4", "--detach", "--", "python3", "-c", SHOW, check=True)
    wide = int(res.stdout)
    c = controller.client(cli.env["RC_TOKEN"])
    assert job(c, wide)["state"] == "queued"
    out = cli.run("explain", str(wide), check=True).stdout.decode()
    assert "hosts it could run on:" in out and "box: 3 of 4 free; cpu1 held by hold" in out
    assert (
        f"hold {hold_id} (alice (token alice)) until " in out
        and "reserved box:cpu0..3 for this job" in out
    )
    ps = cli.json("ps")
    assert [j["count"] for j in ps["queued"] if j["id"] == wide] == [4]
    text = cli.run("ps", check=True).stdout.decode()
    assert "4x *" in text  # the queued wide job, once, with what it asks for
    cli.run("release", str(hold_id), check=True)
    wait_until(lambda: job(c, wide)["state"] == "succeeded", 30, "the 4-device job to run")
    done = job(c, wide)
    assert sorted(done["device_ids"]) == [f"box:cpu{i}" for i in range(4)]
    logs = cli.run("logs", str(wide), check=True).stdout.decode().split()
    assert logs[2] == "4" and len(set(logs[0].split(","))) == 4
    listed = cli.run("jobs", check=True).stdout.decode()
    assert f"{wide}    box:cpu0..3" in listed or f"{wide}  box:cpu0..3" in listed, listed


def test_a_hold_of_two_devices_gives_its_sessions_both(four, cli):
    hold = cli.run("hold", "-n", "2", "--ttl", "10m", "--reason", "two", "--detach", check=True)
    hold_id = int(hold.stdout)
    res = cli.run("exec", str(hold_id), "--", "python3", "-c", SHOW)
    assert res.returncode == 0, res.stderr
    devices, _first, count, _cuda = res.stdout.decode().split()
    assert count == "2" and len(set(devices.split(","))) == 2
    cli.run("release", str(hold_id), check=True)


def test_bad_counts_are_refused_before_anything_is_queued(four, cli):
    res = cli.run("run", "-n", "2", "-d", "box:cpu0", "--", "true")
    assert res.returncode == 2 and b"-n 2 asks for 2 devices but -d names 1" in res.stderr
    res = cli.run("run", "-n", "65", "--", "true")
    assert res.returncode == 2 and b"65 is outside 1..64" in res.stderr
    res = cli.run("run", "-n", "5", "--", "true")
    assert res.returncode == 1
    assert b"no host has 5 devices matching '*'; the most on one host is 4 (on box)" in res.stderr
    res = cli.run("run", "-d", "box:cpu0,box:cpu0", "--", "true")
    assert res.returncode == 1 and b"'box:cpu0' is pinned twice" in res.stderr
    assert cli.json("jobs") == []


def test_a_worker_topology_places_narrow_jobs_in_one_quad_and_a_wide_job_in_the_other(
    controller, make_worker, tmp_path, env, cli
):
    """The issue's placement test through real processes: a fake nvidia-smi
    with 8 GPUs in two NVLink quads; four 1-device jobs land in one quad and
    a 4-device job then gets the whole other quad."""
    fake = FakeNvidiaSmi(tmp_path / "fakebin", gpus=8, topo=QUADS)
    make_worker(controller, host="dgx", devices="auto", worker_env=fake.path_env(env))
    admin = controller.client()
    views = {v["device"]["id"]: v for v in admin.get("/v1/devices")["devices"]}
    labels = {lb["key"]: lb["value"] for lb in views["dgx:gpu5"]["device"]["labels"]}
    assert labels["numa"] == "1"
    narrow = []
    for _ in range(4):
        res = cli.run("run", "-s", "kind=gpu", "--detach", "--", "sleep", "60", check=True)
        narrow.append(int(res.stdout))
    c = controller.client(cli.env["RC_TOKEN"])
    wait_until(lambda: all(job(c, j)["state"] == "running" for j in narrow), 30, "4 narrow jobs")
    assert sorted(job(c, j)["device_id"] for j in narrow) == [f"dgx:gpu{i}" for i in range(4)]
    res = cli.run("run", "-n", "4", "-s", "kind=gpu", "--", "python3", "-c", SHOW)
    assert res.returncode == 0, res.stderr
    devices, _first, count, cuda = res.stdout.decode().split()
    assert devices == ",".join(f"dgx:gpu{i}" for i in range(4, 8)) and count == "4"
    assert cuda == "'4,5,6,7'"
    for j in narrow:
        cli.run("kill", str(j), check=True)


def test_a_registration_with_bad_links_is_refused_naming_the_problem(controller):
    admin = controller.client()
    base = {"host": "h1", "devices": [{"name": "gpu0"}, {"name": "gpu1"}]}
    for links, words in (
        ([{"a": "gpu0", "b": "gpu9", "link": "NV"}], "'gpu9' is not a device here"),
        ([{"a": "gpu0", "b": "gpu0", "link": "NV"}], "joins a device to itself"),
        (
            [{"a": "gpu0", "b": "gpu1", "link": "NV"}, {"a": "gpu1", "b": "gpu0", "link": "SYS"}],
            "is given twice",
        ),
        ([{"a": "gpu0", "b": "gpu1", "link": "NV4"}], "must be one of"),
    ):
        with pytest.raises(ApiError) as e:
            admin.post("/v1/workers/register", {**base, "links": links})
        assert e.value.status == 400 and words in str(e.value), (links, str(e.value))
    got = admin.post(
        "/v1/workers/register", {**base, "links": [{"a": "gpu1", "b": "gpu0", "link": "PIX"}]}
    )
    assert got["worker_id"] == "h1"
    assert json.dumps(got)  # a plain JSON answer
