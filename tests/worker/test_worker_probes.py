"""Probes and labels, usage sheets and the GPU
emptiness check, in process: nvidia-smi's CSV as pure functions, drop-in
output rules, and the preservation rule across passes with a fake nvidia-smi
(healthy, broken, [N/A] memory, disappearing) and real drop-in scripts."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rc.worker import leftovers, nvidia, sheets
from rc.worker.config import DeviceConfig, WorkerConfig
from rc.worker.labels import LABEL_MAX_CHARS, DropinError, Prober, parse_dropin
from rc.worker.probe import cuda_index, device_env
from tests.helpers.fake_nvidia_smi import FakeNvidiaSmi

CAPTURED_GPUS = """\
0, NVIDIA A100-SXM4-80GB, 81920, 80000, 535.104.05, GPU-5f1b2c3d-0000
1, NVIDIA A100-SXM4-80GB, [N/A], [N/A], 535.104.05, GPU-5f1b2c3d-0001
2, Tesla K80, with a comma, 11441, 11380, 470.57.02, [N/A]
garbage line
"""


def test_parse_gpus():
    g0, g1, g2 = nvidia.parse_gpus(CAPTURED_GPUS)
    assert g0.labels() == {
        "kind": "gpu",
        "vendor": "nvidia",
        "model": "NVIDIA A100-SXM4-80GB",
        "vram": "81920M",
        "vram_free": "80000M",
        "driver": "535.104.05",
        "uuid": "GPU-5f1b2c3d-0000",
    }
    assert "vram" not in g1.labels() and "vram_free" not in g1.labels()  # [N/A]: no label
    assert g2.model == "Tesla K80, with a comma" and "uuid" not in g2.labels()


def test_parse_compute_apps():
    text = (
        "GPU-aaaa, 1234, /usr/bin/python3, 500\n"
        "GPU-bbbb, 99, python train.py --lr 0.1, a, b, [N/A]\n"
        "No running processes found\n"
    )
    a, b = nvidia.parse_compute_apps(text)
    assert (a.gpu_uuid, a.pid, a.name, a.used_mib) == ("GPU-aaaa", 1234, "/usr/bin/python3", "500")
    assert (b.pid, b.name, b.used_mib) == (99, "python train.py --lr 0.1, a, b", "")


@given(st.text(max_size=300))
def test_nvidia_parsers_never_raise(text):
    nvidia.parse_gpus(text)
    nvidia.parse_compute_apps(text)


def test_cuda_numbering():
    assert cuda_index("gpu3") == "3" and cuda_index("a100-07") == "7"
    assert cuda_index("cpu0") is None and cuda_index("fpga") is None
    assert device_env("gpu3") == {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert device_env("cpu1") == {"CUDA_VISIBLE_DEVICES": "", "CUDA_DEVICE_ORDER": None}
    assert device_env("fpga") == {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}


# -- drop-in output ----------------------------------------------------------------


def test_dropin_values_and_keys():
    out = json.dumps(
        {
            "rack": "r7",
            "cores": 64,
            "ratio": 1.50,
            "fast": True,
            "slow": False,
            "gone": None,
            "nested": {"a": 1},
            "list": [1],
            "gpu0.ecc": "on",
            "gpu9.ecc": "off",
            ".x": "y",
            "gpu0.": "z",
        }
    ).encode()
    host, per, warnings = parse_dropin(out, {"gpu0", "gpu1"})
    assert host == {"rack": "r7", "cores": "64", "ratio": "1.5", "fast": "true", "slow": "false"}
    assert per == {"gpu0": {"ecc": "on"}}
    assert len(warnings) == 5  # nested, list, unknown device, two malformed


def test_numbers_keep_their_text():
    host, _, _ = parse_dropin(b'{"a": 1.50, "b": 1e3, "c": -0}', set())
    assert host == {"a": "1.50", "b": "1e3", "c": "-0"}


@pytest.mark.parametrize(
    "out", [b"", b"[]", b'"x"', b"{} {}", b'{"a": 1} trailing', b"{", b'{"a": NaN}', b"\xff{}"]
)
def test_dropin_output_must_be_exactly_one_object(out):
    with pytest.raises(DropinError):
        parse_dropin(out, set())


@given(st.binary(max_size=200))
def test_dropin_parser_only_raises_dropin_error(data):
    try:
        parse_dropin(data, {"gpu0"})
    except DropinError:
        pass


# -- sheets ------------------------------------------------------------------------


def test_sheet_fits_on_a_character_boundary():
    assert sheets.fit(b"short") == "short"
    big = ("é" * 40000).encode()  # 80000 bytes of two-byte characters
    text = sheets.fit(big)
    raw = text.encode()
    assert len(raw) <= sheets.SHEET_MAX_BYTES
    assert text.endswith(sheets.TRUNCATED_MARKER)
    assert set(text[: -len(sheets.TRUNCATED_MARKER)]) == {"é"}


@given(st.binary(max_size=200), st.integers(60, 120))
def test_sheet_fit_always_fits(data, limit):
    assert len(sheets.fit(data, limit).encode()) <= limit


def test_sheets_missing_unreadable_and_present(tmp_path):
    assert sheets.read_sheets(str(tmp_path), ["gpu0"]) == ("", {"gpu0": ""})
    (tmp_path / "host.md").write_text("# Box\nbe nice\n")
    (tmp_path / "host.d").mkdir()
    (tmp_path / "host.d" / "gpu0.md").write_text("gpu0 has ECC off")
    (tmp_path / "host.d" / "gpu1.md").mkdir()  # unreadable: left out, the stored copy stays
    assert sheets.read_sheets(str(tmp_path), ["gpu0", "gpu1", "gpu2"]) == (
        "# Box\nbe nice\n",
        {"gpu0": "gpu0 has ECC off", "gpu2": ""},
    )
    (tmp_path / "host.md").unlink()
    (tmp_path / "host.md").mkdir()
    assert sheets.read_sheets(str(tmp_path), [])[0] is None


# -- passes and the preservation rule ------------------------------------------------


@pytest.fixture
def fake(tmp_path, monkeypatch):
    f = FakeNvidiaSmi(tmp_path / "bin", gpus=2)
    monkeypatch.setenv("PATH", f.path_env({"PATH": "/usr/bin:/bin"})["PATH"])
    return f


def prober(tmp_path, *names: str) -> Prober:
    devices = tuple(DeviceConfig(n) for n in names)
    return Prober(
        WorkerConfig(
            host="box",
            devices=devices,
            probe_dir=str(tmp_path / "probe.d"),
            probe_timeout=2.0,
            kill_grace=0.2,
        )
    )


def test_nvidia_labels_land_on_gpu_devices_and_failures_preserve_them(tmp_path, fake):
    p = prober(tmp_path, "gpu0", "gpu1", "cpu0")
    res = p.run()
    assert [d.name for d in res.devices] == ["gpu0", "gpu1", "cpu0"]
    assert res.labels["gpu1"]["model"] == "NVIDIA A100-SXM4-80GB"
    assert res.labels["gpu1"]["vram"] == "81920M" and res.labels["gpu1"]["uuid"] == "GPU-fake-1"
    assert res.labels["cpu0"] == {"kind": "cpu"}
    assert {"cpus", "mem_total_bytes", "kernel"} <= set(res.labels[""])
    assert p.uuids == {"gpu0": "GPU-fake-0", "gpu1": "GPU-fake-1"}

    sent = res.labels
    fake.mode("broken")  # a failing source: its devices keep their labels, health unknown
    res = p.run(res.devices)
    for n in ("gpu0", "gpu1"):
        assert res.labels[n] == {**sent[n], "health": "unknown:nvidia-smi"}
    assert "cpu0" in res.labels
    assert res.failed["nvidia-smi"].startswith("nvidia-smi exited 9")

    fake.mode("na")  # runs and reports: memory facts clear
    res = p.run(res.devices)
    assert "vram" not in res.labels["gpu0"] and res.labels["gpu0"]["model"]

    fake.mode("gone")  # present at start, missing now: a failure, labels kept
    res = p.run(res.devices)
    assert res.labels["gpu0"]["model"] and "nvidia-smi" in res.failed
    assert res.labels["gpu0"]["health"] == "unknown:nvidia-smi"


def test_nvidia_that_never_reported_covers_every_gpu_device(tmp_path, fake):
    fake.mode("broken")
    res = prober(tmp_path, "gpu0", "gpu7", "cpu0").run()
    assert set(res.labels) == {"", "cpu0"}


def test_no_nvidia_smi_at_all_is_not_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    res = prober(tmp_path, "gpu0").run()
    assert res.failed == {} and res.labels["gpu0"] == {}


def write_dropin(d, name: str, body: str, mode: int = 0o755):
    d.mkdir(exist_ok=True)
    path = d / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def test_dropins_merge_in_order_and_failures_preserve_what_they_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    d = tmp_path / "probe.d"
    write_dropin(d, "10-site", """echo '{"site": "b2", "gpu0.ecc": "on", "gpu1.ecc": "on"}'""")
    write_dropin(d, "20-override", """echo '{"gpu1.ecc": "off", "gpu1.fan": "ok"}'""")
    write_dropin(d, "30-notexec", "echo '{}'", mode=0o644)
    (d / "40-dir").mkdir()
    p = prober(tmp_path, "gpu0", "gpu1", "gpu2")
    res = p.run()
    assert res.labels[""]["site"] == "b2"
    assert res.labels["gpu0"] == {"ecc": "on"}
    assert res.labels["gpu1"] == {"ecc": "off", "fan": "ok"}
    assert res.labels["gpu2"] == {}

    write_dropin(d, "20-override", "exit 1")  # fails: gpu1 (which it named) is kept
    res = p.run(res.devices)
    assert "gpu1" not in res.labels and res.labels["gpu0"] == {"ecc": "on"}
    assert res.failed["20-override"] == "exited 1"

    write_dropin(d, "20-override", "echo 'not json'")  # bad output is a failure too
    assert "gpu1" not in p.run(res.devices).labels

    write_dropin(d, "20-override", "echo '{}'")  # runs and reports nothing: clears
    res = p.run(res.devices)
    assert res.labels["gpu1"] == {"ecc": "on"}

    write_dropin(d, "10-site", "sleep 10")  # host-wide facts: a failure keeps every device
    res = p.run(res.devices)
    assert set(res.labels) == {""} and "timed out" in res.failed["10-site"]


def test_a_dropin_that_never_worked_covers_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    d = tmp_path / "probe.d"
    write_dropin(d, "10-broken", "exit 3")
    res = prober(tmp_path, "gpu0").run()
    assert res.labels["gpu0"] == {} and "10-broken" in res.failed


def test_dropin_stdout_over_64k_is_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    d = tmp_path / "probe.d"
    write_dropin(
        d, "10-big", """printf '{"a": "'; head -c 70000 /dev/zero | tr '\\0' x; echo '"}'"""
    )
    res = prober(tmp_path, "gpu0").run()
    assert "more than 65536 bytes" in res.failed["10-big"]


def test_unreadable_probe_dir_fails_every_remembered_dropin(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    d = tmp_path / "probe.d"
    write_dropin(d, "10-a", """echo '{"gpu0.x": "1"}'""")
    p = prober(tmp_path, "gpu0", "gpu1")
    res = p.run()
    assert res.labels["gpu0"] == {"x": "1"}
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    d.write_text("")  # now unreadable as a directory
    res = p.run(res.devices)
    assert "gpu0" not in res.labels and "gpu1" in res.labels
    d.unlink()  # missing: normal, the drop-in's facts clear
    res = p.run(res.devices)
    assert res.labels["gpu0"] == {}


def test_overlong_labels_are_dropped_not_sent(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    long = "v" * (LABEL_MAX_CHARS + 1)
    write_dropin(tmp_path / "probe.d", "10", f"""echo '{{"ok": "1", "long": "{long}"}}'""")
    res = prober(tmp_path, "gpu0").run()
    assert res.labels[""]["ok"] == "1" and "long" not in res.labels[""]


# -- the GPU emptiness check ----------------------------------------------------------


def test_gpu_leftovers(fake):
    assert leftovers.gpu_leftovers("GPU-fake-1", settle=0.2) == ""
    fake.add_app(0, 4242, "python other-gpu.py")
    assert leftovers.gpu_leftovers("GPU-fake-1", settle=0.2) == ""
    fake.add_app(1, 4343, "python train.py", 1024)
    assert leftovers.gpu_leftovers("GPU-fake-1", settle=0.2) == (
        "GPU GPU-fake-1 still has compute processes: pid 4343 'python train.py' (1024 MiB)"
    )
    fake.mode("broken")
    assert leftovers.gpu_leftovers("GPU-fake-1", settle=0.2).startswith(
        "cannot check that GPU GPU-fake-1 is empty: nvidia-smi exited 9"
    )
