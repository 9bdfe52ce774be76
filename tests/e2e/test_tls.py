"""TLS: `rc serve --certfile --keyfile`; the CLI
and the worker verify the controller with --cacert (or the system store), and
an untrusted certificate is a clear one-line error, never a silent downgrade;
`rc up` refuses a non-loopback listen address without TLS unless --insecure."""

from __future__ import annotations

import pytest
import trustme

from tests.helpers.harness import Cli, Controller, Worker
from tests.helpers.wait import wait_until


@pytest.fixture
def tls(tmp_path):
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    ca.cert_pem.write_to_path(str(cafile))
    return certfile, keyfile, cafile


def test_https_controller_with_cli_and_worker(tls, tmp_path, env, pyz):
    certfile, keyfile, cafile = tls
    ctl = Controller(
        tmp_path / "data", env, ["--certfile", str(certfile), "--keyfile", str(keyfile)]
    ).start()
    try:
        assert ctl.url.startswith("https://127.0.0.1:")
        from rc.proto.client import Client

        admin = Client(ctl.url, ctl.admin_token, cacert=str(cafile))
        wtok = admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"]
        utok = admin.post("/v1/tokens", {"name": "alice", "role": "user"})["secret"]
        w = Worker(
            ctl.url,
            wtok,
            tmp_path / "w",
            env,
            host="tlsbox",
            devices="cpu:1",
            pyz=pyz,
            extra=["--cacert", str(cafile)],
        ).start()
        try:
            wait_until(lambda: admin.get("/v1/devices")["devices"], 30, "the worker over TLS")
            cli = Cli(ctl.url, utok, env, tmp_path)
            res = cli.run("run", "--cacert", str(cafile), "--", "echo", "over tls")
            assert res.returncode == 0, res.stderr
            assert res.stdout == b"over tls\n"
            env_ca = dict(cli.env, RC_CACERT=str(cafile))
            ok = Cli(ctl.url, utok, env_ca, tmp_path).run("devices")
            assert ok.returncode == 0 and b"tlsbox:cpu0" in ok.stdout
            bad = cli.run("devices")  # no CA: the system store does not trust it
            assert bad.returncode == 1
            assert b"not trusted" in bad.stderr and b"--cacert" in bad.stderr
            assert len(bad.stderr.strip().splitlines()) == 1
        finally:
            w.stop()
        admin.close_all()
    finally:
        ctl.stop()


def test_rc_up_refuses_plain_http_off_loopback(tmp_path, env):
    cli = Cli("http://127.0.0.1:1", "x", env, tmp_path)
    res = cli.run("up", "--listen", "0.0.0.0:0", "--data", str(tmp_path / "d"))
    assert res.returncode == 2
    assert b"--insecure" in res.stderr and b"--certfile" in res.stderr


def test_serve_refuses_half_a_tls_config(tmp_path, env, tls):
    certfile, _, _ = tls
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rc",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(tmp_path / "d"),
            "--certfile",
            str(certfile),
        ],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 1
    assert b"--certfile and --keyfile go together" in res.stderr
    assert b"Traceback" not in res.stderr


@pytest.mark.parametrize("which", ["missing", "key", "directory"])
def test_bad_ca_file_is_one_line_for_the_cli(tls, tmp_path, env, which):
    _, keyfile, _ = tls
    bad = {"missing": tmp_path / "nonexistent.pem", "key": keyfile, "directory": tmp_path}[which]
    cli = Cli("https://127.0.0.1:1", "rc_x", env, tmp_path)
    res = cli.run("whoami", "--cacert", str(bad))
    assert res.returncode != 0
    assert b"Traceback" not in res.stderr, res.stderr
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rc: ") and str(bad) in lines[0], lines


@pytest.mark.parametrize("which", ["missing", "key"])
def test_bad_ca_file_is_one_line_for_the_worker(tls, tmp_path, env, pyz, which):
    import subprocess

    from tests.helpers.harness import BARE_PY

    _, keyfile, _ = tls
    bad = {"missing": tmp_path / "nonexistent.pem", "key": keyfile}[which]
    tok = tmp_path / "w.token"
    tok.write_text("rc_x")
    w = subprocess.run(
        [
            BARE_PY,
            "-I",
            str(pyz),
            "worker",
            "--controller",
            "https://127.0.0.1:1",
            "--token-file",
            str(tok),
            "--host",
            "b",
            "--devices",
            "cpu:1",
            "--cacert",
            str(bad),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert w.returncode != 0
    assert b"Traceback" not in w.stderr, w.stderr
    lines = w.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rc worker: ") and str(bad) in lines[0], lines


def test_config_cacert_is_relative_to_the_config_file_and_a_wrong_ca_is_named(tls, tmp_path, env):
    certfile, keyfile, cafile = tls
    ctl = Controller(
        tmp_path / "data", env, ["--certfile", str(certfile), "--keyfile", str(keyfile)]
    ).start()
    try:
        conf_dir = tmp_path / "conf"
        conf_dir.mkdir()
        (conf_dir / "ca.pem").write_bytes(cafile.read_bytes())
        conf = conf_dir / "config.toml"
        conf.write_text(
            f'controller = "{ctl.url}"\ntoken = "{ctl.admin_token}"\ncacert = "ca.pem"\n'
        )
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        e = {k: v for k, v in env.items()}
        e["RC_CONFIG"] = str(conf)
        import subprocess
        import sys

        res = subprocess.run(
            [sys.executable, "-m", "rc", "whoami"],
            env=e,
            cwd=elsewhere,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, res.stderr
        # a CA that did not sign the controller's certificate: named, no "pass --cacert"
        other = tmp_path / "other-ca.pem"
        trustme.CA().cert_pem.write_to_path(str(other))
        res = subprocess.run(
            [sys.executable, "-m", "rc", "whoami", "--cacert", str(other)],
            env=e,
            cwd=elsewhere,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 1
        err = res.stderr.decode()
        assert len(err.strip().splitlines()) == 1, err
        assert "not trusted" in err and str(other) in err and "pass --cacert" not in err, err
    finally:
        ctl.stop()


def _openssl_pair(tmp_path, name: str) -> tuple:
    import subprocess

    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


@pytest.mark.parametrize("case", ["mismatch", "key_as_cert", "cert_as_key"])
def test_serve_refuses_a_bad_tls_pair_in_one_line(tmp_path, env, case):
    import subprocess
    import sys

    cert, key = _openssl_pair(tmp_path, "a")
    _, other_key = _openssl_pair(tmp_path, "b")
    certfile, keyfile = {
        "mismatch": (cert, other_key),
        "key_as_cert": (key, key),
        "cert_as_key": (cert, cert),
    }[case]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rc",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data",
            str(tmp_path / "d"),
            "--certfile",
            str(certfile),
            "--keyfile",
            str(keyfile),
        ],
        env=env,
        capture_output=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert res.returncode != 0
    assert b"Traceback" not in res.stderr, res.stderr
    lines = res.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert (
        lines[0].startswith("rc serve: ") and str(certfile) in lines[0] and str(keyfile) in lines[0]
    ), lines
    if case == "mismatch":
        assert "does not belong to the certificate" in lines[0]
