"""TLS (issue "Multi-user security"): `rc serve --certfile --keyfile`; the CLI
and the worker verify the controller with --cacert (or the system store), and
an untrusted certificate is a clear one-line error, never a silent downgrade;
`rc up` refuses a non-loopback listen address without TLS unless --insecure."""

from __future__ import annotations

import pytest
import trustme

from tests.harness import Cli, Controller, Worker, wait_until

pytestmark = pytest.mark.e2e


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
    ctl = Controller(tmp_path / "data", env,
                     ["--certfile", str(certfile), "--keyfile", str(keyfile)]).start()
    try:
        assert ctl.url.startswith("https://127.0.0.1:")
        from rc.proto.client import Client

        admin = Client(ctl.url, ctl.admin_token, cacert=str(cafile))
        wtok = admin.post("/v1/tokens", {"name": "w", "role": "worker"})["secret"]
        utok = admin.post("/v1/tokens", {"name": "alice", "role": "user"})["secret"]
        w = Worker(ctl.url, wtok, tmp_path / "w", env, host="tlsbox", devices="cpu:1",
                   pyz=pyz, extra=["--cacert", str(cafile)]).start()
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

    res = subprocess.run([sys.executable, "-m", "rc", "serve", "--listen", "127.0.0.1:0",
                          "--data", str(tmp_path / "d"), "--certfile", str(certfile)],
                         env=env, capture_output=True, timeout=60)
    assert res.returncode == 1
    assert b"--certfile and --keyfile go together" in res.stderr
    assert b"Traceback" not in res.stderr
