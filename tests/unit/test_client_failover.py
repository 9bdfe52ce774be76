"""A client of a list of controller URLs (README "Clients and workers: a list
of controllers"): the list is parsed with errors naming the bad item, and a
request moves on from a controller that cannot be reached or answers 503
`standby` (to the active one it names when that is on the list), until the
request's deadline.

The controllers here are small HTTP servers inside the test, on loopback:
the real standby controller is built on another branch (the controller
side of the standby contract), and what is under test is only how the
client reads the contract's 503 answer. The e2e tests with real controllers
are in tests/e2e/test_failover_e2e.py."""

from __future__ import annotations

import json
import socket
import threading
import time
import types
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rc.cli.credentials import names_controller
from rc.proto import client as client_module
from rc.proto.client import Client, parse_controller_url, parse_controller_urls
from rc.proto.errors import ApiError, RcError, TransportError
from tests.helpers.wait import wait_until


def closed_port() -> int:
    """A loopback port nothing listens on (bound, read back, closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeController:
    """A loopback HTTP server answering every request with `status` and
    `body` (JSON); counts the requests it got."""

    def __init__(self, status: int = 200, body: dict | None = None) -> None:
        self.status, self.body, self.hits = status, body or {"ok": True}, 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.hits += 1
                data = json.dumps(fake.body).encode()
                self.send_response(fake.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if fake.status == 503:
                    self.send_header("Retry-After", "1")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def standby(active: str | None) -> dict:
    where = f"the active controller is {active}" if active else "no controller is active"
    return {
        "error": "standby",
        "message": f"this controller is a standby; {where}",
        "active": active,
    }


@pytest.fixture
def fakes() -> Iterator:
    made: list[FakeController] = []

    def make(status: int = 200, body: dict | None = None) -> FakeController:
        made.append(FakeController(status, body))
        return made[-1]

    yield make
    for f in made:
        f.close()


def test_a_list_is_parsed_and_a_bad_item_is_named():
    urls = parse_controller_urls(" http://a:1 , http://b:2/rc ")
    assert [str(u) for u in urls] == ["http://a:1", "http://b:2/rc"]
    assert parse_controller_urls("http://a:1") == [parse_controller_url("http://a:1")]
    bad = {
        "http://a:1,,http://b:2": "item 2 is empty",
        "http://a:1,b:2": "controller URL 'b:2' has no scheme",
        "http://a:1,ftp://b:2": "scheme must be http or https",
        "http://a:1,http://a:1/": "http://a:1 is listed twice",
        "http://a:1,unix:///run/rc.sock": "item 2 (unix:///run/rc.sock) is a local socket",
        "http://a:1,https://b:2": "mixes http and https",
        ",".join(f"http://h{n}:1" for n in range(17)): "has 17 URLs; at most 16",
    }
    for text, problem in bad.items():
        with pytest.raises(RcError) as e:
            parse_controller_urls(text)
        assert problem in str(e.value), text


def test_names_controller_finds_a_url_in_a_list():
    assert names_controller("http://a:1,http://127.0.0.1:8080", "http://127.0.0.1:8080")
    assert names_controller("http://127.0.0.1:8080/", "http://127.0.0.1:8080")
    assert not names_controller("http://a:1,http://b:2", "http://127.0.0.1:8080")
    assert not names_controller("", "http://127.0.0.1:8080")


def test_a_closed_port_first_is_passed_over_at_once(fakes, monkeypatch):
    live = fakes()
    c = Client(f"http://127.0.0.1:{closed_port()},{live.url}", timeout=5)
    pauses: list[float] = []
    clock = types.SimpleNamespace(monotonic=time.monotonic, sleep=pauses.append)
    monkeypatch.setattr(client_module, "time", clock)
    assert c.get("/v1/x") == {"ok": True}
    assert pauses == []  # no backoff before the first round is done
    assert str(c.url) == live.url
    c.get("/v1/x")  # the client stays with the one that answered
    assert live.hits == 2


def test_a_standby_sends_the_client_to_the_active_one_it_names(fakes):
    live = fakes()
    passed_over = fakes()
    stby = fakes(503, standby(live.url))
    c = Client(f"{stby.url},{passed_over.url},{live.url}", timeout=5)
    assert c.get("/v1/x") == {"ok": True}
    assert (stby.hits, passed_over.hits, live.hits) == (1, 0, 1)


def test_a_standby_naming_no_one_or_a_stranger_sends_the_client_to_the_next(fakes):
    live = fakes()
    for active in (None, "http://10.9.9.9:1"):
        stby = fakes(503, standby(active))
        c = Client(f"{stby.url},{live.url}", timeout=5)
        assert c.get("/v1/x") == {"ok": True}
        assert stby.hits == 1


def test_a_single_url_client_does_not_retry_a_standby(fakes):
    stby = fakes(503, standby("http://ctl-a:8080"))
    c = Client(stby.url, timeout=5)
    with pytest.raises(ApiError) as e:
        c.get("/v1/x")
    assert (e.value.status, e.value.code, e.value.active) == (503, "standby", "http://ctl-a:8080")
    assert stby.hits == 1


def test_a_list_nobody_answers_fails_at_the_deadline_naming_each(fakes):
    a, b = closed_port(), closed_port()
    c = Client(f"http://127.0.0.1:{a},http://127.0.0.1:{b}", timeout=0.6, connect_timeout=0.4)
    waiting: list[str] = []
    c.on_waiting = waiting.append
    t0 = time.monotonic()
    with pytest.raises(TransportError) as e:
        c.get("/v1/x")
    took = time.monotonic() - t0
    assert 0.9 <= took < 30  # read timeout + connect timeout, cycling with backoff
    # said once, after the first round (found by a new user: 65 s without a word)
    refused = "connection refused (is the controller running?)"
    assert waiting == [f"http://127.0.0.1:{a}: {refused}; http://127.0.0.1:{b}: {refused}"]
    assert str(e.value) == (
        f"no controller of the list answered (http://127.0.0.1:{a}: connection refused "
        f"(is the controller running?); http://127.0.0.1:{b}: connection refused "
        "(is the controller running?))"
    )


def test_all_standbys_are_cycled_until_one_becomes_active(fakes):
    """During a takeover every controller may say standby for a moment: the
    client backs off and asks again rather than failing."""
    one = fakes(503, standby(None))
    two = fakes(503, standby(None))
    c = Client(f"{one.url},{two.url}", timeout=10)
    done: list = []
    t = threading.Thread(target=lambda: done.append(c.get("/v1/x")), daemon=True)
    t.start()
    wait_until(lambda: one.hits + two.hits >= 4, 10, "more than one round of the list")
    two.status, two.body = 200, {"ok": "two"}
    t.join(10)
    assert done == [{"ok": "two"}]


def test_an_abandoned_list_client_gives_up_after_one_round(fakes, monkeypatch):
    """A worker shutting down sets `abandon`: its requests try each URL once
    more and then fail, rather than cycling on until their deadline."""
    c = Client(f"http://127.0.0.1:{closed_port()},http://127.0.0.1:{closed_port()}", timeout=30)
    c.abandon = threading.Event()
    c.abandon.set()
    tried: list[str] = []
    send = c._request_once
    monkeypatch.setattr(c, "_request_once", lambda url, *a: tried.append(str(url)) or send(url, *a))
    with pytest.raises(TransportError):
        c.get("/v1/x")
    assert sorted(tried) == sorted(str(u) for u in c.urls)  # each URL once, then it gave up


def test_the_worker_config_takes_a_list_and_names_a_bad_item(tmp_path):
    from rc.worker import config as worker_config

    path = tmp_path / "worker.toml"
    path.write_text('controller_url = "http://a:1,http://b:2"\n')
    assert worker_config.load(str(path), {}).controller_url == "http://a:1,http://b:2"
    path.write_text('controller_url = "http://a:1,,http://b:2"\n')
    with pytest.raises(worker_config.ConfigError) as e:
        worker_config.load(str(path), {})
    assert str(e.value) == (
        f"{path}: controller_url: controller URL list 'http://a:1,,http://b:2': item 2 is empty"
    )
    with pytest.raises(worker_config.ConfigError) as e:
        worker_config.load(None, {"controller_url": "http://a:1,ftp://b"})
    assert str(e.value) == (
        "command line: controller_url: controller URL 'ftp://b': scheme must be http or https"
    )
