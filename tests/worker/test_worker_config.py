"""The worker's configuration: every key, its defaults, the
environment's one-way semantics, and an error naming file, key and problem
for everything wrong. Plus `rc worker --print-config` from the zipapp."""

from __future__ import annotations

import subprocess
import textwrap
import tomllib
from pathlib import Path

import pytest

from rc.worker import config as wc
from rc.worker.config import ConfigError, DeviceConfig, WorkerConfig
from tests.helpers.harness import BARE_PY, PY, REPO, base_env

FULL = """
controller_url = "http://127.0.0.1:9999"
token = "secret-in-file"
host = "gpu-box"
labels = { site = "b2", rack = 7, fast = true }
heartbeat_interval = "5s"
poll_wait = "20s"
kill_grace = "1500ms"
hooks = { timeout = "45s", release_linger = "2m" }
probe_dir = "/srv/probe.d"
probe_interval = "10m"
probe_timeout = "3s"
verify_dir = "/srv/verify.d"
verify_timeout = "20s"
verify_pass_budget = "90s"
sheet_dir = "/srv/sheets"
require_manual_clear = false
spool_dir = "/var/spool/rc"
spool_max_bytes = 1048576

[[devices]]
name = "gpu0"
max_runtime = "24h"
on_acquire = "/etc/rc/hooks/acquire"
on_release = "/etc/rc/hooks/release"
timeout = "10s"
release_linger = "0s"
labels = { tier = "a" }

[[devices]]
name = "gpu1"
"""


def write(tmp_path, text: str, name: str = "worker.toml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_every_key_is_read(tmp_path):
    cfg = wc.load(write(tmp_path, FULL), env={})
    assert cfg.controller_url == "http://127.0.0.1:9999"
    assert cfg.token == "secret-in-file"
    assert cfg.host == "gpu-box"
    assert cfg.labels == {"site": "b2", "rack": "7", "fast": "true"}
    assert (cfg.heartbeat_interval, cfg.poll_wait, cfg.kill_grace) == (5.0, 20.0, 1.5)
    assert (cfg.hook_timeout, cfg.release_linger) == (45.0, 120.0)
    assert (cfg.probe_dir, cfg.probe_interval, cfg.probe_timeout) == ("/srv/probe.d", 600.0, 3.0)
    assert (cfg.verify_dir, cfg.verify_timeout, cfg.verify_pass_budget) == (
        "/srv/verify.d",
        20.0,
        90.0,
    )
    assert cfg.sheet_dir == "/srv/sheets"
    assert (cfg.spool_dir, cfg.spool_max_bytes) == ("/var/spool/rc", 1 << 20)
    gpu0, gpu1 = cfg.devices
    assert gpu0 == DeviceConfig(
        "gpu0", 86400.0, "/etc/rc/hooks/acquire", "/etc/rc/hooks/release", 10.0, 0.0, {"tier": "a"}
    )
    assert gpu1 == DeviceConfig("gpu1")
    # per-device hook settings override the host's; unset ones inherit
    assert cfg.device_timeout(gpu0) == 10.0 and cfg.device_linger(gpu0) == 0.0
    assert cfg.device_timeout(gpu1) == 45.0 and cfg.device_linger(gpu1) == 120.0


def test_defaults_of_every_key(tmp_path):
    cfg = wc.load(write(tmp_path, 'controller_url = "http://c:1"\n'), env={})
    assert cfg.heartbeat_interval == 10 and cfg.poll_wait == 30 and cfg.kill_grace == 10
    assert cfg.hook_timeout == 60 and cfg.release_linger == 30
    assert cfg.probe_dir == "/etc/rc/probe.d" and cfg.probe_interval == 300
    assert cfg.probe_timeout == 5
    assert cfg.verify_dir == "/etc/rc/verify.d" and cfg.verify_timeout == 30
    assert cfg.verify_pass_budget == 120
    assert cfg.sheet_dir == "/etc/rc" and cfg.require_manual_clear is False
    assert cfg.devices == "auto"
    assert cfg.host  # the hostname


def test_configs_built_in_code_get_defaults_never_unbounded():
    cfg = WorkerConfig(
        heartbeat_interval=0,
        poll_wait=-1,
        kill_grace=0,
        hook_timeout=0,
        probe_interval=0,
        probe_timeout=0,
        verify_timeout=0,
        verify_pass_budget=0,
        release_linger=-5,
    )
    assert cfg.heartbeat_interval == 10 and cfg.poll_wait == 30 and cfg.kill_grace == 10
    assert cfg.hook_timeout == 60 and cfg.probe_interval == 300 and cfg.probe_timeout == 5
    assert cfg.verify_timeout == 30 and cfg.verify_pass_budget == 120
    assert cfg.release_linger == 30
    d = DeviceConfig("gpu0")  # no timeout of its own: the host's, never zero
    assert cfg.device_timeout(d) == 60 and cfg.device_linger(d) == 30


@pytest.mark.parametrize(
    "text, key, problem",
    [
        ("nope = 1", "nope", "not a known key"),
        ('hooks = { timeout = "1s", colour = "red" }', "hooks.colour", "not a known key"),
        ('devices = [{ name = "gpu0", colour = "red" }]', "devices[0].colour", "not a known key"),
        # a misspelt key names the nearest known one
        (
            "require_manual_claer = true",
            "require_manual_claer",
            "not a known key (did you mean 'require_manual_clear'?)",
        ),
        (
            'hooks = { timout = "1s" }',
            "hooks.timout",
            "not a known key (did you mean 'timeout'?)",
        ),
        (
            'devices = [{ name = "gpu0", max_runtim = "1h" }]',
            "devices[0].max_runtim",
            "not a known key (did you mean 'max_runtime'?)",
        ),
        (
            'devices = [{ name = "gpu0", max_runtime = "500ms" }]',
            "devices[0].max_runtime",
            "at least 1s",
        ),
        (
            'devices = [{ name = "gpu0", max_runtime = "1500ms" }]',
            "devices[0].max_runtime",
            "whole seconds",
        ),
        ('devices = [{ name = "gpu0", on_acquire = "  " }]', "devices[0].on_acquire", "blank"),
        ('devices = [{ name = "gpu0", on_release = "" }]', "devices[0].on_release", "blank"),
        ('devices = [{ name = "gpu0", on_release = 3 }]', "devices[0].on_release", "blank"),
        ('devices = [{ max_runtime = "1h" }]', "devices[0]", "needs a name"),
        ('devices = ["gpu0", "gpu0"]', "devices[1]", "listed twice"),
        ('devices = ["gpu/0"]', "devices[0].name", "letters, digits"),
        ("devices = []", "devices", "non-empty"),
        ("devices = 3", "devices", "non-empty list"),
        ("poll_wait = true", "poll_wait", "duration"),
        ('poll_wait = "soon"', "poll_wait", "bad duration"),
        ("poll_wait = -3", "poll_wait", "negative"),
        ("kill_grace = [1]", "kill_grace", "duration"),
        ("host = 5", "host", "must be a string"),
        ('host = "a b"', "host", "letters, digits"),
        ('controller_url = "ctl:8080"', "controller_url", "no scheme"),
        ('require_manual_clear = "yes"', "require_manual_clear", "true or false"),
        ('spool_max_bytes = "1G"', "spool_max_bytes", "integer"),
        ("spool_max_bytes = -1", "spool_max_bytes", "integer"),
        ('labels = "x"', "labels", "table"),
        ("labels = { a = [1] }", "labels.a", "must be a string"),
        ("hooks = 5", "hooks", "table"),
        ('hooks = { timeout = "x" }', "hooks.timeout", "bad duration"),
        ('devices = [{ name = "gpu0", timeout = false }]', "devices[0].timeout", "duration"),
        ('devices = [{ name = "gpu0", labels = { a = {} } }]', "devices[0].labels.a", "string"),
        ("x = ", "", "not valid TOML"),
    ],
)
def test_errors_name_the_file_the_key_and_the_problem(tmp_path, text, key, problem):
    path = write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as e:
        wc.load(path, env={})
    msg = str(e.value)
    assert msg.startswith(path + ": "), msg
    assert key in msg and problem in msg, msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    "text, key",
    [
        ('heartbeat_interval = "１０"', "heartbeat_interval"),
        ('poll_wait = "１０s"', "poll_wait"),
        ('kill_grace = "1.５s"', "kill_grace"),
        ('hooks = { timeout = "٣m" }', "hooks.timeout"),
        ('hooks = { release_linger = "３０s" }', "hooks.release_linger"),
        ('devices = [{ name = "gpu0", max_runtime = "２h" }]', "devices[0].max_runtime"),
        ('devices = [{ name = "gpu0", timeout = "１m" }]', "devices[0].timeout"),
        ('devices = "cpu:２"', "devices"),
        ('devices = "cpu:٣"', "devices"),
        ('devices = "cpu:"', "devices"),
    ],
)
def test_numbers_take_ascii_digits_only(tmp_path, text, key):
    """As everywhere in rc (rc.proto.duration), digits are 0-9, and the error
    says so: `devices = "cpu:２"` was refused as a device name with a bad
    character, not as a count."""
    path = write(tmp_path, 'controller_url = "http://c:1"\n' + text + "\n")
    with pytest.raises(ConfigError) as e:
        wc.load(path, env={})
    msg = str(e.value)
    assert msg.startswith(f"{path}: {key}"), msg
    assert "bad duration" in msg or "cpu:N takes N in digits 0-9" in msg, msg


def test_rc_worker_devices_cpu_n_takes_ascii_digits_only(tmp_path):
    empty = write(tmp_path, "")
    with pytest.raises(ConfigError, match=r"^command line: devices 'cpu:２': cpu:N takes N in"):
        wc.load(empty, overrides={"devices": "cpu:２"}, env={})
    assert wc.load(empty, overrides={"devices": "cpu:12"}, env={}).devices == "cpu:12"


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        wc.load(str(tmp_path / "absent.toml"), env={})
    with pytest.raises(ConfigError, match="cannot read"):
        wc.load(str(tmp_path), env={})  # a directory


def test_rc_token_fills_a_missing_token_and_the_file_wins(tmp_path):
    plain = write(tmp_path, 'controller_url = "http://c:1"\n')
    assert wc.load(plain, env={"RC_TOKEN": " from-env "}).token == "from-env"
    assert wc.load(plain, env={"RC_TOKEN": "   "}).token == ""  # blank is ignored
    with_token = write(tmp_path, 'token = "from-file"\n', "t.toml")
    assert wc.load(with_token, env={"RC_TOKEN": "from-env"}).token == "from-file"
    tf = tmp_path / "tok"
    tf.write_text("from-token-file\n")
    via_file = write(tmp_path, f'token_file = "{tf}"\n', "tf.toml")
    assert wc.load(via_file, env={"RC_TOKEN": "from-env"}).token == "from-token-file"
    missing = write(tmp_path, f'token_file = "{tmp_path / "nope"}"\n', "tm.toml")
    with pytest.raises(ConfigError, match="token_file"):
        wc.load(missing, env={})


def test_token_file_errors_name_the_flag_or_the_file_that_gave_the_path(tmp_path, monkeypatch):
    """Found by a new user: a --token-file that did not exist was reported as
    "/etc/rc/worker.toml: token_file ...", a file that did not exist either."""
    monkeypatch.setattr(wc, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    missing = tmp_path / "x" / "worker.token"
    with pytest.raises(ConfigError) as e:
        wc.load(None, {"token_file": str(missing)}, env={})
    assert str(e.value) == f"--token-file {missing}: No such file or directory"
    other = tmp_path / "other.token"
    path = write(tmp_path, f'token_file = "{other}"\n')
    with pytest.raises(ConfigError) as e:
        wc.load(path, env={})
    assert str(e.value) == f"{path}: token_file {other}: No such file or directory"
    with pytest.raises(ConfigError) as e:  # the flag overrides the file, and is named
        wc.load(path, {"token_file": str(missing)}, env={})
    assert str(e.value) == f"--token-file {missing}: No such file or directory"
    empty = tmp_path / "empty.token"  # e.g. `rc token create ... > FILE` failed
    empty.write_text("\n")
    with pytest.raises(ConfigError) as e:
        wc.load(None, {"token_file": str(empty)}, env={"RC_TOKEN": "rc_other"})
    assert str(e.value).startswith(f"--token-file {empty}: the file is empty")


def test_worker_with_a_missing_token_file_names_the_flag(tmp_path):
    missing = tmp_path / "x" / "worker.token"
    res = subprocess.run(
        [
            PY,
            "-m",
            "rc",
            "worker",
            "--controller",
            "http://127.0.0.1:9",
            "--token-file",
            str(missing),
        ],
        env=base_env(tmp_path),
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 2
    assert res.stderr.decode() == f"rc worker: --token-file {missing}: No such file or directory\n"


@pytest.mark.parametrize(
    "value, file_value, expected",
    [
        (None, False, False),
        ("", False, False),
        ("  ", False, False),
        ("1", False, True),
        ("true", False, True),
        ("YES", False, True),
        ("on", False, True),
        ("0", False, False),
        ("false", False, False),
        ("off", False, False),
        ("0", True, True),  # the environment can only turn it on
        ("maybe", False, True),  # unparseable counts as true
        ("2", False, True),
    ],
)
def test_require_manual_clear_from_the_environment_is_one_way(
    tmp_path, capsys, value, file_value, expected
):
    path = write(tmp_path, f"require_manual_clear = {str(file_value).lower()}\n")
    env = {} if value is None else {"RC_REQUIRE_MANUAL_CLEAR": value}
    assert wc.load(path, env=env).require_manual_clear is expected
    if value in ("maybe", "2"):
        assert "not a boolean" in capsys.readouterr().err


def test_command_line_overrides_the_file(tmp_path):
    path = write(tmp_path, 'host = "from-file"\ndevices = "cpu:4"\n')
    cfg = wc.load(path, {"host": "from-flag", "devices": "gpu0,gpu1", "token_file": None}, env={})
    assert cfg.host == "from-flag"
    assert [d.name for d in cfg.devices] == ["gpu0", "gpu1"]
    with pytest.raises(ConfigError, match=r"^command line: devices"):
        wc.load(path, {"devices": "gpu0,,x"}, env={})


def test_printed_config_reads_back_to_the_same_config(tmp_path):
    cfg = wc.load(write(tmp_path, FULL), env={})
    text = cfg.as_toml()
    assert "secret-in-file" not in text and "# token: set" in text
    tomllib.loads(text)
    again = wc.load(write(tmp_path, text, "again.toml"), env={})
    assert again == WorkerConfig(**{**{f: getattr(cfg, f) for f in cfg.__slots__}, "token": ""})


def test_print_config_from_the_zipapp(pyz, tmp_path):
    path = write(tmp_path, FULL)
    res = subprocess.run(
        [
            BARE_PY,
            "-I",
            str(pyz),
            "worker",
            "--config",
            path,
            "--print-config",
            "--host",
            "other-box",
        ],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert 'host = "other-box"' in out and 'kill_grace = "1500ms"' in out
    assert 'hooks = { timeout = "45s", release_linger = "2m" }' in out
    assert "secret-in-file" not in out
    bad = write(tmp_path, 'devices = [{ name = "gpu0", on_acquire = " " }]\n', "bad.toml")
    res = subprocess.run(
        [BARE_PY, "-I", str(pyz), "worker", "--config", bad, "--print-config"],
        capture_output=True,
        timeout=30,
        cwd=tmp_path,
        check=False,
    )
    assert res.returncode == 2
    err = res.stderr.decode()
    assert err.count("\n") == 1 and bad in err and "devices[0].on_acquire" in err
    assert "Traceback" not in err


# -- the operator's documents are true -------------------------------------------


def _operator_section() -> str:
    text = (REPO / "README.md").read_text()
    return text.split("## Operating a worker", 1)[1].split("\n## ", 1)[0]


def test_example_config_and_readme_snippet_load(tmp_path):
    token = tmp_path / "token"  # /etc/rc/worker.token on a real host
    token.write_text("rc_example\n")

    def load(path: str) -> WorkerConfig:
        text = Path(path).read_text()
        assert 'token_file = "/etc/rc/worker.token"' in text
        return wc.load(
            write(tmp_path, text.replace("/etc/rc/worker.token", str(token)), "copy.toml"), env={}
        )

    cfg = load(str(REPO / "examples" / "worker.toml"))
    assert cfg.controller_url == "http://gpu-controller:8080" and cfg.devices == "auto"
    assert cfg.token == "rc_example" and cfg.labels == {"site": "lab-b2"}
    section = _operator_section()
    snippet = section.split("Write `/etc/rc/worker.toml`", 1)[1].split("\n\n")[1]
    cfg = load(write(tmp_path, textwrap.dedent(snippet)))
    assert (cfg.controller_url, cfg.token, cfg.devices) == (
        "http://gpu-controller:8080",
        "rc_example",
        "auto",
    )


def test_example_config_lists_every_key_with_its_default(tmp_path):
    """examples/worker.toml says it lists every key: each key `load` reads is
    there (set, or commented out as `# key = value`), and uncommenting the
    commented ones changes nothing (they show the defaults)."""
    text = (REPO / "examples" / "worker.toml").read_text()
    top = text.split("# To give devices", 1)[0]
    keys = (
        wc._DURATIONS
        | wc._STRINGS
        | wc._BOOLS
        | {"pass_env", "spool_max_bytes", "labels", "hooks", "devices"}
    )
    listed, commented, lines = set(), set(), []
    for line in top.splitlines():
        bare = line.removeprefix("# ")
        key = bare.split("=", 1)[0].strip() if "=" in bare.split("#", 1)[0] else ""
        if key in keys:
            listed.add(key)
            if line.startswith("# "):
                commented.add(key)
                if key in ("host", "token"):  # examples, not defaults
                    continue
                line = bare
        lines.append(line)
    assert listed == keys, f"missing from examples/worker.toml: {sorted(keys - listed)}"
    token = tmp_path / "token"
    token.write_text("rc_example\n")
    plain = wc.load(
        write(tmp_path, top.replace("/etc/rc/worker.token", str(token)), "a.toml"), env={}
    )
    uncommented = wc.load(
        write(tmp_path, "\n".join(lines).replace("/etc/rc/worker.token", str(token)), "b.toml"),
        env={},
    )
    assert uncommented == plain
    d = WorkerConfig()
    assert all(getattr(plain, k) == getattr(d, k) for k in commented - {"hooks", "host", "token"})


def test_readme_defaults_match_the_code():
    section = _operator_section()
    d = WorkerConfig()
    for phrase, value in (
        ("`kill_grace` (10 s)", d.kill_grace == 10),
        ("`release_linger` (30 s)", d.release_linger == 30),
        ("`probe_interval` (5 m)", d.probe_interval == 300),
        ("(`spool_max_bytes`, 256 MiB)", d.spool_max_bytes == 256 << 20),
    ):
        assert phrase in " ".join(section.split()) and value, phrase


def test_deployment_examples_run_the_zipapp_worker():
    unit = (REPO / "examples" / "rc-worker.service").read_text()
    assert (
        "ExecStart=/usr/bin/python3 -I /usr/local/lib/rc/rc.pyz worker --config /etc/rc/worker.toml"
    ) in unit
    assert "KillMode=mixed" in unit  # the worker, not systemd, ends its jobs
    stop = int(unit.split("TimeoutStopSec=")[1].split()[0])
    assert stop >= 10 + 45 + 20  # kill grace + reports + releases
    ds = (REPO / "examples" / "rc-worker-daemonset.yaml").read_text()
    assert '["python3", "-I", "/opt/rc/rc.pyz", "worker",' in ds
    grace = int(ds.split("terminationGracePeriodSeconds:")[1].split()[0])
    assert grace >= 10 + 45 + 20
    assert "examples/rc-worker.service" in _operator_section()
