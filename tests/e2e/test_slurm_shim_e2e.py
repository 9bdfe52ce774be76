"""`rc shim slurm DIR`: Slurm's commands over rc, driven with the command
lines the tools that call Slurm send against a real controller
and worker: batchspawner's `squeue -h -j ID -o '%T %B'` and `scancel ID`,
submitit's `sacct -o JobID,State --parsable2 -j ID -j ID` and the `srun` of
its batch scripts, a person's `squeue --me` and `sinfo`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.fleet_users import admin, alice, bob, fleet  # noqa: F401 (fixtures)
from tests.helpers.harness import job
from tests.helpers.wait import wait_until


@pytest.fixture(scope="module")
def shims(fleet, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("shims") / "bin"
    res = fleet[1]["alice"].run("shim", "slurm", str(d), check=True)
    assert f'export PATH="{d}:$PATH"'.encode() in res.stdout
    return d


def slurm(cli, shims: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(shims / name), *args],
        env=cli.env,
        cwd=cli.cwd,
        capture_output=True,
        timeout=60,
        check=False,
    )


def _running_hold(cli, device: str) -> int:
    out = cli.run("hold", "-d", device, "--ttl", "10m", "--reason", "r", "--detach", check=True)
    return int(out.stdout)


def test_the_shims_are_scripts_and_never_go_over_a_real_slurm(alice, shims, tmp_path):
    for name in ("sbatch", "srun", "squeue", "scancel", "sacct", "sinfo"):
        assert (shims / name).stat().st_mode & 0o111, name
    real = tmp_path / "slurm"
    real.mkdir()
    (real / "sbatch").write_text("#!/bin/sh\necho real slurm\n")
    res = alice.run("shim", "slurm", str(real))
    assert res.returncode == 1 and b"is not one of rc's shims" in res.stderr
    assert (real / "sbatch").read_text() == "#!/bin/sh\necho real slurm\n"
    assert not (real / "squeue").exists()


def test_batchspawner_squeue_and_scancel(alice, admin, shims):
    held = _running_hold(alice, "box:cpu0")
    wait_until(lambda: job(admin, held)["state"] == "running", 30, "the hold to run")
    queued = int(alice.run("run", "-d", "box:cpu0", "--detach", "--", "true", check=True).stdout)
    res = slurm(alice, shims, "squeue", "-h", "-j", str(held), "-o", "%T %B")
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().split() == ["RUNNING", "box"]
    res = slurm(alice, shims, "squeue", "-h", "-j", str(queued), "-o", "%T %B")
    assert res.stdout.decode().split() == ["PENDING", "n/a"]
    assert slurm(alice, shims, "scancel", str(queued)).returncode == 0
    assert job(admin, queued)["state"] == "killed"
    # an ended job leaves squeue's listing, as a purged one leaves Slurm's
    res = slurm(alice, shims, "squeue", "-h", "-j", str(queued), "-o", "%T %B")
    assert res.returncode == 0 and res.stdout == b""
    assert slurm(alice, shims, "scancel", str(held)).returncode == 0
    wait_until(lambda: job(admin, held)["state"] == "killed", 30, "the hold to end")


def test_submitit_sacct_parsable(alice, admin, shims):
    ok = int(alice.run("run", "-d", "box:cpu1", "--detach", "--", "true", check=True).stdout)
    bad = int(alice.run("run", "-d", "box:cpu1", "--detach", "--", "sh", "-c", "exit 3").stdout)
    for i in (ok, bad):
        wait_until(lambda i=i: job(admin, i)["finished_at"] is not None, 30, f"job {i} to end")
    res = slurm(
        alice, shims, "sacct", "-o", "JobID,State", "--parsable2", "-j", str(ok), "-j", str(bad)
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode().splitlines()
    assert lines == ["JobID|State", f"{ok}|COMPLETED", f"{bad}|FAILED"]
    res = slurm(alice, shims, "sacct", "-X", "-n", "-P", "-j", str(bad), "-o", "JobID,ExitCode")
    assert res.stdout.decode().split() == [f"{bad}|3:0"]
    res = slurm(alice, shims, "sacct", "-o", "JobID,Nope", "-j", str(ok))
    assert res.returncode == 1 and b'Invalid field requested: "Nope"' in res.stderr


def test_squeue_me_sinfo_and_what_is_not_supported(alice, bob, admin, shims):
    held = _running_hold(bob, "box:cpu0")
    wait_until(lambda: job(admin, held)["state"] == "running", 30, "bob's hold to run")
    mine = slurm(alice, shims, "squeue", "--me")
    assert mine.returncode == 0 and str(held).encode() not in mine.stdout
    assert mine.stdout.split(b"\n")[0].split() == [
        b"JOBID",
        b"PARTITION",
        b"NAME",
        b"USER",
        b"ST",
        b"TIME",
        b"NODES",
        b"NODELIST(REASON)",
    ]
    everyone = slurm(alice, shims, "squeue")
    assert f" {held} ".encode() in everyone.stdout and b" R " in everyone.stdout
    info = slurm(alice, shims, "sinfo", "-h").stdout.decode().split()
    assert info == ["rc*", "up", "infinite", "1", "mix", "box"]
    res = slurm(alice, shims, "squeue", "--cluster", "x")
    assert res.returncode == 1 and b"rc's squeue does not support --cluster" in res.stderr
    res = slurm(alice, shims, "scancel", "--signal", "USR1", str(held))
    assert res.returncode == 1 and b"does not send signals" in res.stderr
    assert job(admin, held)["state"] == "running"
    bob.run("release", str(held), check=True)


def test_srun_inside_a_job_runs_there(alice, admin, shims):
    script = f'{shims}/srun --unbuffered -- sh -c "echo in job $RC_JOB_ID"'
    res = alice.run("run", "-d", "box:cpu1", "--", "sh", "-c", script, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().startswith("in job ")


def test_sbatch_as_submitit_and_batchspawner_send_it(alice, admin, shims, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH -J from-sbatch\n#SBATCH -t 1:00\necho hi $1\n")
    res = slurm(alice, shims, "sbatch", str(script), "there")
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert out.startswith("Submitted batch job "), out
    first = int(out.split()[-1])
    res = subprocess.run(
        [str(shims / "sbatch"), "--parsable"],
        input=b"#!/bin/sh\n#SBATCH -J spawner\necho from stdin\n",
        env=alice.env,
        cwd=alice.cwd,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    second = int(res.stdout)
    for i in (first, second):
        wait_until(lambda i=i: job(admin, i)["finished_at"] is not None, 60, f"job {i}")
    assert job(admin, first)["name"] == "from-sbatch"
    assert job(admin, first)["max_runtime_seconds"] == 60
    assert job(admin, second)["state"] == "succeeded"
