"""An active/standby controller pair over one PostgreSQL database, and what each instance says about itself."""

from __future__ import annotations

import http.client
import json
import shutil
import urllib.parse

import pytest

from tests.helpers.wait import wait_until

psycopg = pytest.importorskip("psycopg")


def _raw(url: str, method: str, path: str, token: str = "", body: bytes | None = None):
    """(status, headers with lower-case names, body) of one request."""
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _leader_row(dsn: str):
    with psycopg.connect(dsn, autocommit=True) as c:
        return c.execute("SELECT holder, url, epoch FROM leadership").fetchone()


def _instance(ctl) -> str:
    return json.loads((ctl.data / "controller.json").read_text())["instance"]


def _is_active(ctl, token: str) -> bool:
    try:
        return _raw(ctl.url, "GET", "/v1/whoami", token)[0] == 200
    except OSError:
        return False


def _pair(make_controller, dsn, tmp_path, *extra: str):
    """Controller a (active: started first), then b (standby); b gets a's
    admin token file (tokens are in the database) and both one log dir."""
    logs = tmp_path / "shared-logs"
    flags = ("--database", dsn, "--log-dir", str(logs), *extra)
    a = make_controller(*flags, data=tmp_path / "a")
    wait_until(lambda: (a.data / "admin.token").exists(), 20, "a to become active")
    token = a.admin_token
    wait_until(lambda: _is_active(a, token), 20, "a to answer")
    b = make_controller(*flags, data=tmp_path / "b")
    b.data.mkdir(exist_ok=True)
    shutil.copy(a.data / "admin.token", b.data / "admin.token")
    return a, b, token
