"""A lab's daily life, tried as lab members on a shared box: a
one-box started as root (`rc up -d`) and real Unix users on its socket.

- their environment: from an activated venv, `rc run -- python` is the
  venv's python; secrets, rc's own variables and the device variables stay
  home; --export NONE is the clean start, and a command it cannot find says
  the PATH the job had; another user sees none of the values;
- their scripts: `rc batch` with #SBATCH/#RC directives, run as the user
  with its arguments, from the script as it was when submitted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rc.proto.client import Client
from tests.helpers.harness import PY, SYSTEM_PY, UserCli, base_env, job
from tests.helpers.wait import wait_until

HOST = "dbox"
ALICE, BOB = "rc-test-alice", "rc-test-bob"


@dataclass
class Box:
    data: Path
    socket: str
    admin: Client
    pyz: Path
    said: str
    """What rc up -d said on stderr."""

    def user(self, name: str, **env: str) -> UserCli:
        return UserCli(name, self.pyz, {"RC_SOCKET": self.socket, **env})


@pytest.fixture(scope="module")
def box(unix_users, public_pyz, tmp_path_factory) -> Iterator[Box]:
    root = Path(tempfile.mkdtemp(prefix="rc-daily-", dir="/tmp"))
    root.chmod(0o755)
    env = base_env(tmp_path_factory.mktemp("root-home"))
    env["RC_SOCKET"] = str(root / "rc.sock")
    data = root / "data"
    res = subprocess.run(
        [PY, "-m", "rc", "up", "-d", "--data", str(data), "--listen", "127.0.0.1:0",
         "--devices", "2", "--host", HOST],
        env=env, cwd=root, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    url = json.loads((data / "up.json").read_text())["url"]
    admin = Client(url, (data / "admin.token").read_text().strip())
    try:
        yield Box(data, env["RC_SOCKET"], admin, public_pyz, res.stderr.decode())
    finally:
        subprocess.run(
            [PY, "-m", "rc", "down", "--data", str(data)],
            env=env, cwd=root, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


def _venv(user: UserCli) -> Path:
    """A venv in the user's home, made as the user (no pip: fast)."""
    where = Path(user.home) / "venv-daily"
    if not where.exists():
        res = subprocess.run(
            ["/usr/sbin/runuser", "-u", user.name, "--", SYSTEM_PY, "-m", "venv",
             "--without-pip", str(where)],
            capture_output=True, timeout=120, check=False, cwd=user.home,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
    return where


def _job_id(stderr: bytes) -> int:
    return int(re.search(rb"job (\d+)", stderr).group(1))


# -- the caller's environment ---------------------------------------------------------


def test_from_an_activated_venv_python_is_the_venvs(box):
    """The issue's first breakage: the README's own `rc run -- python ...`
    from an activated venv failed (cannot start 'python')."""
    plain = box.user(ALICE)
    venv = _venv(plain)
    alice = box.user(
        ALICE, PATH=f"{venv}/bin:{plain.env['PATH']}", VIRTUAL_ENV=str(venv), LAB_MODE="train"
    )
    res = alice.run("run", "--", "python", "-c", "import sys; print(sys.prefix)", timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().strip() == str(venv)
    res = alice.run("run", "--", "sh", "-c", 'echo "$LAB_MODE $(id -un)"', timeout=120)
    assert res.stdout.decode().split() == ["train", ALICE], res.stderr


def test_secrets_rc_and_device_variables_stay_home_unless_named(box):
    alice = box.user(
        ALICE,
        HF_TOKEN="hf_secret",
        RC_KILL_ON_DETACH="0",
        RC_FAKE="leak",
        CUDA_VISIBLE_DEVICES="7",
        SSH_AUTH_SOCK="/tmp/nope",
    )
    show = (
        "import os; print(repr({k: os.environ.get(k) for k in "
        "('HF_TOKEN', 'RC_FAKE', 'RC_KILL_ON_DETACH', 'CUDA_VISIBLE_DEVICES', "
        "'SSH_AUTH_SOCK', 'RC_JOB_ID')}))"
    )
    res = alice.run("run", "--", SYSTEM_PY, "-c", show, timeout=120)
    assert res.returncode == 0, res.stderr
    got = eval(res.stdout.decode())
    assert got["HF_TOKEN"] is None and got["RC_FAKE"] is None
    assert got["RC_KILL_ON_DETACH"] is None and got["SSH_AUTH_SOCK"] is None
    assert got["CUDA_VISIBLE_DEVICES"] != "7" and got["RC_JOB_ID"] == str(_job_id(res.stderr))
    assert b"look like secrets): HF_TOKEN" in res.stderr
    res = alice.run("run", "-e", "HF_TOKEN", "--", "sh", "-c", 'echo "$HF_TOKEN"', timeout=120)
    assert res.stdout.strip() == b"hf_secret", res.stderr


def test_export_none_is_the_clean_start_and_a_missing_command_names_the_path(box):
    alice = box.user(ALICE, LAB_MODE="train")
    res = alice.run("run", "--export", "NONE", "--", "sh", "-c", 'echo "[$LAB_MODE]"')
    assert res.stdout.strip() == b"[]", res.stderr
    res = alice.run("run", "--export", "NONE", "--", "no-such-tool-xyz", timeout=120)
    assert res.returncode == 127
    said = res.stdout + res.stderr
    assert b"not found on the job's PATH=/usr/local/sbin:/usr/local/bin:" in said, said
    res = alice.run(
        "run", "--export", "LAB_MODE,EXTRA=1", "--", "sh", "-c", 'echo "$LAB_MODE $EXTRA $PATH"'
    )
    assert res.stdout.split()[:2] == [b"train", b"1"], res.stderr
    assert res.stdout.split()[2].startswith(b"/usr/local/sbin"), res.stdout  # PATH not listed
    res = alice.run("run", "--export", "RC_TOKEN", "--", "true")
    assert res.returncode == 2 and b"rc's to set" in res.stderr


def test_another_user_sees_names_never_values(box):
    alice = box.user(ALICE, LAB_DB="postgres://alice:pw@db/lab")
    res = alice.run("run", "--", "true", timeout=120)
    assert res.returncode == 0, res.stderr
    job_id = _job_id(res.stderr)
    assert job(box.admin, job_id)["env"]["LAB_DB"] == "postgres://alice:pw@db/lab"
    res = box.user(BOB).run("show", job_id.__str__(), "-o", "json")
    assert res.returncode == 0, res.stderr
    env = json.loads(res.stdout)["job"]["env"]
    assert env["LAB_DB"] == "(hidden)" and "alice:pw" not in res.stdout.decode()
    wait_until(lambda: job(box.admin, job_id)["state"] == "succeeded", 30, "the job to end")


# -- batch scripts ---------------------------------------------------------------------


def _owned_by(path: Path, name: str, text: str) -> Path:
    import pwd

    path.write_text(text)
    entry = pwd.getpwnam(name)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def test_a_batch_script_runs_as_its_user_as_it_was_when_submitted(box):
    """The issue's "done when": a script with `#SBATCH -J x -t 1:00` runs."""
    alice = box.user(ALICE)
    script = _owned_by(
        Path(alice.home) / "daily-job.sh",
        ALICE,
        "#!/bin/bash\n#SBATCH -J x -t 1:00\n#RC -e MODE=batch\n"
        'echo "$(id -un) $1 $MODE $RC_JOB_NAME $(basename "$0")"\n',
    )
    blocker = int(alice.run("run", "--detach", "--", "sleep", "600").stdout)
    other = int(alice.run("run", "--detach", "--", "sleep", "600").stdout)
    res = alice.run("batch", "--after", f"{blocker}:any", str(script), "first arg")
    assert res.returncode == 0, res.stderr
    job_id = int(res.stdout)
    script.write_text("#!/bin/bash\necho edited\n")  # after the submit: changes nothing
    got = job(box.admin, job_id)
    assert (got["name"], got["max_runtime_seconds"], got["state"]) == ("x", 60, "queued")
    alice.run("kill", str(blocker), str(other))
    wait_until(lambda: job(box.admin, job_id)["state"] == "succeeded", 60, "the script to end")
    out = alice.run("logs", str(job_id)).stdout.decode()
    assert out == f"{ALICE} first arg batch x daily-job.sh\n"


def test_rc_run_script_follows_it_and_the_command_line_wins(box):
    alice = box.user(ALICE)
    script = _owned_by(
        Path(alice.home) / "daily-run.sh",
        ALICE,
        '#!/bin/sh\n#SBATCH --job-name=from-script --time=2\necho "$RC_JOB_NAME $1"\nexit 3\n',
    )
    res = alice.run("run", "--name", "from-cli", "--script", str(script), "--", "a1", timeout=120)
    assert res.returncode == 3 and res.stdout == b"from-cli a1\n", res.stderr
    assert job(box.admin, _job_id(res.stderr))["max_runtime_seconds"] == 120


def test_an_unknown_sbatch_option_is_named_or_skipped_when_lenient(box):
    alice = box.user(ALICE)
    script = _owned_by(
        Path(alice.home) / "daily-mem.sh",
        ALICE,
        "#!/bin/sh\n#SBATCH --partition=gpu\n#SBATCH --mem=4G\necho ok\n",
    )
    res = alice.run("batch", str(script))
    assert (
        res.returncode == 2
        and b"daily-mem.sh:2: #SBATCH --partition is not an option" in res.stderr
    )
    res = alice.run("run", "--lenient", "--script", str(script), timeout=120)
    assert res.returncode == 0 and res.stdout == b"ok\n", res.stderr
    assert b"skipped #SBATCH --mem: rc does not support it yet" in res.stderr


# -- the queue, edited -------------------------------------------------------------------


def _state(box: Box, job_id: int) -> str:
    return job(box.admin, job_id)["state"]


def _detach(user: UserCli, *args: str) -> int:
    res = user.run("run", "--detach", *args)
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def test_stash_and_unstash_keep_the_order(box):
    """A stashed job takes no device and keeps its place: unstashed, it goes
    before the jobs queued after it."""
    alice = box.user(ALICE)
    s1, s2 = (_detach(alice, "--", "sleep", "600") for _ in range(2))
    a, b, c = (_detach(alice, "--", "sleep", "600") for _ in range(3))
    try:
        wait_until(lambda: _state(box, s2) == "running", 30, "both devices to be taken")
        res = alice.run("stash", str(a))
        assert res.returncode == 0 and b"stashed" in res.stdout, res.stderr
        shown = alice.run("show", str(a)).stdout.decode()
        assert f"rc unstash {a} lets it go" in shown, shown
        said = alice.run("explain", str(a)).stdout.decode()
        assert "It is stashed" in said, said
        alice.run("kill", str(s1))
        wait_until(lambda: _state(box, b) == "running", 30, f"job {b} to pass the stashed {a}")
        assert _state(box, a) == "queued"
        assert alice.run("unstash", str(a)).returncode == 0
        alice.run("kill", str(s2))
        wait_until(lambda: _state(box, a) == "running", 30, f"job {a} to start before {c}")
        assert _state(box, c) == "queued"
        feed = box.admin.get("/v1/events", params={"limit": 1000})["events"]
        texts = [e["text"] for e in feed if e["kind"] == "job_updated" and e["job_id"] == a]
        assert texts == [
            f"job {a} changed by {ALICE}: stashed",
            f"job {a} changed by {ALICE}: unstashed",
        ]
    finally:
        alice.run("kill", *(str(j) for j in (s1, s2, a, b, c)))


def test_begin_waits_and_update_moves_it(box):
    alice = box.user(ALICE)
    later = _detach(alice, "--begin", "+1h", "--", "true")
    said = alice.run("explain", str(later)).stdout.decode()
    assert "It begins at" in said and "(--begin)" in said, said
    assert "begins at:" in alice.run("show", str(later)).stdout.decode()
    assert _state(box, later) == "queued"
    assert alice.run("update", str(later), "--begin", "now").returncode == 0
    wait_until(lambda: _state(box, later) == "succeeded", 30, "the job to run once its time came")


def test_update_within_the_callers_limits(box):
    alice, bob = box.user(ALICE), box.user(BOB)
    j = _detach(alice, "--begin", "+1h", "--max-runtime", "1h", "--", "true")
    try:
        res = alice.run("update", str(j), "--name", "renamed", "--max-runtime", "30m")
        assert res.returncode == 0, res.stderr
        got = job(box.admin, j)
        assert (got["name"], got["max_runtime_seconds"]) == ("renamed", 1800)
        res = alice.run("update", str(j), "--max-runtime", "2h")
        assert res.returncode == 1 and b"only an admin lengthen it" in res.stderr
        res = alice.run("update", str(j), "--priority", "5")
        assert res.returncode == 1 and b"priority_not_allowed" in res.stderr
        res = bob.run("update", str(j), "--priority", "-1")
        assert res.returncode == 1 and b"not_job_owner" in res.stderr
        box.admin.post(f"/v1/jobs/{j}/update", {"max_runtime_seconds": 7200, "priority": 5})
        got = job(box.admin, j)
        assert (got["max_runtime_seconds"], got["priority"]) == (7200, 5)
        res = alice.run("update", str(j))
        assert res.returncode == 2 and b"say what to change" in res.stderr
    finally:
        alice.run("kill", str(j))
    res = alice.run("update", str(j), "--name", "x")
    assert res.returncode == 1 and b"only a queued job can be changed" in res.stderr


# -- crowded queues ----------------------------------------------------------------------


def test_a_crowded_queue_is_cut_with_who_was_left_out(box):
    alice, bob = box.user(ALICE), box.user(BOB)
    s1, s2 = (_detach(alice, "--", "sleep", "600") for _ in range(2))
    crowd = _detach(alice, "--array", "0-59", "--", "sleep", "600")
    mine = _detach(bob, "--", "sleep", "600")
    try:
        wait_until(lambda: _state(box, s2) == "running", 30, "both devices to be taken")
        lines = alice.run("ps").stdout.decode().splitlines()
        queued = [x for x in lines if "queued (#" in x]
        assert len(queued) == 50, lines
        # fair share is on (a shared box): bob's one job may have gone ahead of alice's 60
        assert re.fullmatch(
            rf"\.\.\. and 11 more queued: (11 by {ALICE}|10 by {ALICE}, 1 by {BOB}) "
            r"\(-n 0 lists them all\)",
            lines[-1],
        ), lines
        lines = bob.run("ps", "--mine").stdout.decode().splitlines()
        assert [x.split()[0] for x in lines[1:]] == [str(mine)], lines
        lines = bob.run("ps", "-u", ALICE, "--state", "running").stdout.decode().splitlines()
        assert sorted(x.split()[0] for x in lines[1:]) == sorted([str(s1), str(s2)]), lines
        lines = bob.run("ps", "-n", "2", "--state", "queued").stdout.decode().splitlines()
        assert len(lines) == 4 and lines[-1].startswith("... and 59 more queued: "), lines
        st = json.loads(bob.run("ps", "-o", "json").stdout)
        assert len(st["queued"]) == 61 and st["queued_left_out"] == 0
        res = bob.run("ps", "--state", "failed")
        assert res.returncode == 2 and b"rc jobs --state" in res.stderr
    finally:
        alice.run("kill", str(s1), str(s2))
        alice.run("kill", "--array", str(crowd))
        bob.run("kill", str(mine))
        wait_until(
            lambda: not box.admin.get("/v1/state")["queued"], 60, "the crowd to be cancelled"
        )


# -- shared-box defaults -----------------------------------------------------------------


def test_a_shared_box_is_fair_and_holds_end(box):
    """sudo rc up -d: fair share on (7-day half-life), holds of at most 24 h,
    idle holds reclaimed after at least 10 min; each said by rc up."""
    assert (
        "fair share: half-life 7d; a hold's ttl: at most 24h; "
        "a hold's idle timeout: at least 10m" in box.said
    ), box.said
    alice = box.user(ALICE)
    res = alice.run("hold", "--ttl", "2d", "--reason", "r", "--detach")
    assert res.returncode == 1 and b"at most 1d here" in res.stderr, res.stderr
    res = alice.run("hold", "--ttl", "1h", "--idle-timeout", "0", "--reason", "r", "--detach")
    assert res.returncode == 1 and b"at least 10m here, not turned off" in res.stderr
    res = alice.run("hold", "--ttl", "1h", "--idle-timeout", "1m", "--reason", "r", "--detach")
    assert res.returncode == 1 and b"at least 10m here, not 1m" in res.stderr
    res = alice.run("hold", "--ttl", "23h", "--reason", "r", "--detach", timeout=120)
    assert res.returncode == 0, res.stderr
    hold = int(res.stdout)
    try:
        res = alice.run("extend", str(hold), "2h")
        assert res.returncode == 1 and b"--hold-ttl-max" in res.stderr, res.stderr
        assert alice.run("extend", str(hold), "1h").returncode == 0
        box.admin.post(f"/v1/jobs/{hold}/extend", {"seconds": 3600})  # an admin may
        assert job(box.admin, hold)["max_runtime_seconds"] == 25 * 3600
    finally:
        alice.run("release", str(hold))
    running = json.loads((box.data / "up.json").read_text())["scheduling"]
    assert running == {"fair_share": "7d", "hold_ttl_max": "24h", "hold_idle_timeout_min": "10m"}
