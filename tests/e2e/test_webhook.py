"""The webhook sink: feed events POSTed to a receiver on loopback; a stuck
receiver never blocks the controller, and what it cannot take is counted."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from tests.helpers.wait import wait_until


class Receiver:
    """A loopback HTTP server recording JSON bodies; `stall` makes it hang."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.stall = threading.Event()
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.stall.is_set():
                    outer.release.wait(30)
                outer.bodies.append(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_events_reach_the_webhook(receiver, make_controller):
    ctl = make_controller("--webhook-url", receiver.url)
    c = ctl.client()
    worker = ctl.token("w", "worker")
    from rc.proto.client import Client

    Client(ctl.url, worker).post(
        "/v1/workers/register", {"host": "wh", "devices": [{"name": "cpu0"}]}
    )
    Client(ctl.url, worker).post("/v1/devices/wh:cpu0/fault", {"reason": "verify failed: ecc"})
    c.post("/v1/devices/wh:cpu0/clear", {"force": True})  # no worker runs to scan

    def device_events():
        return [b for b in receiver.bodies if b["event"] != "token_created"]

    wait_until(lambda: len(device_events()) >= 2, 15, "two webhook deliveries")
    assert [b["event"] for b in device_events()] == ["verify_failed", "device_cleared"]
    first = device_events()[0]
    assert first["device"] == "wh:cpu0" and first["reason"] == "verify failed: ecc"
    assert set(first) >= {"event", "device", "job", "reason", "at"}
    assert first["at"].endswith("Z")


def test_a_stuck_receiver_never_blocks_and_drops_are_counted(receiver, make_controller):
    receiver.stall.set()
    ctl = make_controller("--webhook-url", receiver.url)
    c = ctl.client()
    from rc.proto.client import Client

    worker = ctl.token("w", "worker")
    Client(ctl.url, worker).post(
        "/v1/workers/register", {"host": "wh", "devices": [{"name": "cpu0"}]}
    )
    for i in range(300):  # each drain/undrain is an event; the queue holds 256
        c.post("/v1/devices/wh:cpu0/drain" if i % 2 == 0 else "/v1/devices/wh:cpu0/undrain")
    # the controller still answers at once
    assert c.get("/v1/whoami")["role"] == "admin"
    wait_until(lambda: "webhook: queue full" in ctl.log(), 15, "a drop to be logged")
    metrics = c.request("GET", "/metrics").body.decode()
    dropped = [line for line in metrics.splitlines() if line.startswith("rc_webhook_dropped")]
    assert dropped and float(dropped[0].split()[-1]) > 0
    receiver.release.set()
