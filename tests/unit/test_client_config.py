"""The client's config file and token, as a new user meets them: a misspelt
key is named with the key meant, and a refused token says where it came from."""

from __future__ import annotations

import pytest

from rc.cli import config as client_config


def test_an_unknown_key_is_a_warning_naming_the_nearest_known_key(tmp_path, capsys):
    path = tmp_path / "config.toml"
    path.write_text('contoller = "http://x:1"\ntoken = "rc_t"\ncolour = "red"\n')
    got = client_config.read_file(path)
    assert got == {"token": "rc_t"}  # the unknown keys are ignored, the rest is used
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"rc: warning: {path}: unknown key 'contoller' ignored (did you mean 'controller'?)",
        f"rc: warning: {path}: unknown key 'colour' ignored (known: controller, token, cacert)",
    ]
    client_config.read_file(path)  # once per process, however often it is read
    assert capsys.readouterr().err == ""


def test_file_problem_tells_missing_from_corrupt(tmp_path):
    path = tmp_path / "config.toml"
    assert client_config.file_problem(path) == "missing"
    path.write_text('controller = "http://x:1"\n')
    assert client_config.file_problem(path) is None
    path.write_text("controller = \n")
    assert "Invalid value" in client_config.file_problem(path)
    path.write_bytes(b'token = "\xff"\n')
    assert client_config.file_problem(path)


def test_cacert_survives_a_rewrite(tmp_path):
    path = tmp_path / "rc" / "config.toml"
    client_config.write_config(path, "https://x:1", "rc_t", 'ca "dir"\\ca.pem')
    assert client_config.read_file(path) == {
        "controller": "https://x:1",
        "token": "rc_t",
        "cacert": 'ca "dir"\\ca.pem',
    }
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_redirect_is_an_api_error_not_a_crash():
    """Found by a new user: `rc share set '' 3` posted to /v1/shares/, the
    controller redirected (307) and the client died with a TypeError."""
    import http.server
    import threading

    from rc.proto.client import Client
    from rc.proto.errors import ApiError

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(307)
            self.send_header("Location", "/v1/shares")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        c = Client(f"http://127.0.0.1:{server.server_port}", "t", timeout=10)
        with pytest.raises(ApiError, match="redirect to /v1/shares") as e:
            c.post("/v1/shares/", {"weight": 3})
        assert e.value.status == 307
        c.close_all()
    finally:
        server.shutdown()
        server.server_close()
