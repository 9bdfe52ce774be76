"""The dashboard's one-time sign-in codes (rc.controller.signin), through
the real ASGI app in-process on a fake clock: a code opens one session
acting as exactly its caller, is refused the second time and after
CODE_S, is never stored in the database nor logged; the session ends no
later than the caller's own token and with its revocation; and the
counts per caller are bounded."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from rc.controller.app import build_app
from rc.controller.signin import (
    CODE_PREFIX,
    CODE_S,
    CODES_PER_CALLER,
    SESSION_S,
    SESSIONS_PER_CALLER,
)
from tests.helpers.asgi import call
from tests.helpers.inprocess import T0, Lab

CODE, SESSION = "/v1/dashboard/code", "/v1/dashboard/session"


class Site:
    """A Lab and its app, called as a given token (or none)."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.app = build_app(lab.ctl)
        self.admin = (lab.data / "admin.token").read_text().strip()

    def call(self, method: str, path: str, token: str | None, body=None) -> tuple[int, dict]:
        status, data = self.lab.run(call(self.app, method, path, body, token=token))
        return status, orjson.loads(data) if data else {}

    def token(self, name: str, **kw) -> str:
        status, got = self.call(
            "POST", "/v1/tokens", self.admin, {"name": name, "role": "user", **kw}
        )
        assert status == 201, got
        return got["secret"]

    def code(self, token: str) -> str:
        status, got = self.call("POST", CODE, token, {})
        assert status == 201, got
        return got["code"]

    def spend(self, code: str) -> tuple[int, dict]:
        return self.call("POST", SESSION, None, {"code": code})

    def whoami(self, token: str) -> tuple[int, dict]:
        return self.call("GET", "/v1/whoami", token)


@pytest.fixture
def site(tmp_path) -> Iterator[Site]:
    lab = Lab(tmp_path / "data")
    try:
        yield Site(lab)
    finally:
        lab.close()


def test_a_code_opens_one_session_acting_as_its_caller_and_is_refused_after(site):
    alice = site.token("alice", unix_user="svc-alice")
    status, got = site.call("POST", CODE, alice, {})
    assert status == 201, got
    assert got["code"].startswith(CODE_PREFIX) and got["expires_in_seconds"] == CODE_S
    assert got["expires_at"] == T0 + CODE_S
    status, session = site.spend(got["code"])
    assert status == 201, session
    assert (session["name"], session["role"]) == ("alice", "user")
    assert session["token"] != alice and session["expires_at"] == T0 + SESSION_S
    assert site.whoami(session["token"]) == site.whoami(alice)
    assert site.whoami(session["token"])[1]["unix_user"] == "svc-alice"
    status, again = site.spend(got["code"])
    assert (status, again["error"]) == (401, "unauthorized")
    assert "run rc dashboard again" in again["message"]
    assert site.whoami(session["token"])[0] == 200  # the session itself goes on
    for bad in ("", "rcc_nonsense", alice):  # nor is any token a code
        assert site.spend(bad)[0] == 401


def test_a_code_is_refused_after_its_120_seconds(site):
    alice = site.token("alice")
    late, in_time = site.code(alice), site.code(alice)
    site.lab.now += CODE_S - 1
    assert site.spend(in_time)[0] == 201
    site.lab.now += 1
    status, got = site.spend(late)
    assert (status, got["error"]) == (401, "unauthorized"), got


def test_a_session_ends_no_later_than_its_callers_token(site):
    brief = site.token("brief", expires_in_seconds=600)
    status, session = site.spend(site.code(brief))
    assert status == 201 and session["expires_at"] == T0 + 600
    site.lab.now += 600
    assert site.whoami(session["token"])[0] == 401
    admin_session = site.spend(site.code(site.admin))[1]
    assert admin_session["role"] == "admin"
    site.lab.now += SESSION_S
    assert site.whoami(admin_session["token"])[0] == 401  # at most SESSION_S


def test_revoking_the_token_ends_its_sessions_and_codes(site):
    alice, bob = site.token("alice"), site.token("bob")
    hers = site.spend(site.code(alice))[1]["token"]
    his = site.spend(site.code(bob))[1]["token"]
    pending = site.code(alice)
    assert site.call("DELETE", "/v1/tokens/alice", site.admin)[0] == 200
    assert site.whoami(hers)[0] == 401
    assert site.spend(pending)[0] == 401
    assert site.whoami(his)[0] == 200


def test_codes_and_sessions_are_bounded_per_caller(site):
    alice, bob = site.token("alice"), site.token("bob")
    codes = [site.code(alice) for _ in range(CODES_PER_CALLER + 1)]
    bobs = site.code(bob)
    assert site.spend(codes[0])[0] == 401  # the oldest went
    assert site.spend(bobs)[0] == 201  # another caller's is untouched
    sessions = [site.spend(c)[1]["token"] for c in codes[1:]]
    sessions.append(site.spend(site.code(alice))[1]["token"])
    assert len(sessions) == SESSIONS_PER_CALLER + 1
    assert site.whoami(sessions[0])[0] == 401  # the oldest went
    assert all(site.whoami(s)[0] == 200 for s in sessions[1:])
    assert site.lab.ctl.signin.live() == (0, SESSIONS_PER_CALLER + 1)


def test_a_worker_gets_no_code(site):
    status, got = site.call("POST", "/v1/tokens", site.admin, {"name": "w-box", "role": "worker"})
    assert status == 201
    assert site.call("POST", CODE, got["secret"], {})[0] == 403


def test_a_code_is_never_stored_nor_logged(site, caplog):
    caplog.set_level(logging.DEBUG)
    alice = site.token("alice")
    code = site.code(alice)
    session = site.spend(code)[1]["token"]
    site.spend(code)
    stored = b"".join(p.read_bytes() for p in Path(site.lab.data).rglob("*") if p.is_file())
    for secret in (code, session):
        assert secret.encode() not in stored
        assert all(secret not in r.getMessage() for r in caplog.records)
