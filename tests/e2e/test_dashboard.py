"""The dashboard in a real headless Chromium: Debian's chromium and
chromium-driver driven by selenium, against a real `rc serve` and a real worker
from the zipapp. The page loads with a token, lists the devices and a running
job with its live log, updates when the job ends without a reload, shows a
hostile label as text, returns a quarantined device through the admin "Return
to pool" action, is photographed, and marks itself stale when the controller
goes away. The tests share one controller, worker and browser and run in order."""

from __future__ import annotations

import base64
import hashlib
import html
import pwd
import re
import shutil
import stat
import struct
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from rc.proto import copyjob
from rc.proto.client import Client
from rc.proto.relay import Download, Upload
from tests.helpers.harness import (
    TEST_USERS,
    Controller,
    UserCli,
    Worker,
    base_env,
    device_state,
    job,
)
from tests.helpers.wait import wait_until

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
WIDTH, HEIGHT = 1400, 900
HOSTILE = '<img src=x onerror="window.__pwned=1">'
STATIC = Path(__file__).resolve().parents[2] / "rc" / "controller" / "static"

pytestmark = [
    pytest.mark.skipif(
        not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
        reason="needs Debian's chromium and chromium-driver "
        "(apt-get install -y chromium chromium-driver)",
    ),
]


@dataclass
class Site:
    ctl: Controller
    worker: Worker
    root: Path
    alice: str


@pytest.fixture(scope="module")
def site(tmp_path_factory, pyz):
    root = tmp_path_factory.mktemp("dashboard")
    home = root / "home"
    home.mkdir()
    env = base_env(home)
    # its local socket, for the sign-in of a socket user (rc dashboard)
    ctl = Controller(root / "data", env, socket=env["RC_SOCKET"]).start()
    worker = None
    try:
        conf = root / "worker.toml"
        conf.write_text(f'kill_grace = "1s"\nlabels = {{ model = \'{HOSTILE}\', site = "b2" }}\n')
        worker = Worker(
            ctl.url,
            ctl.token("worker-box", "worker"),
            root / "workers",
            env,
            host="box",
            devices="cpu:2",
            pyz=pyz,
            config=conf,
        ).start()
        admin = ctl.client()
        wait_until(
            lambda: [device_state(admin, f"box:cpu{i}") for i in (0, 1)] == ["ready"] * 2,
            30,
            "the worker's two devices",
        )
        yield Site(ctl, worker, root, ctl.token("alice"))
    finally:
        if worker is not None:
            worker.stop()
        ctl.stop()


@pytest.fixture(scope="module")
def browser(site):
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in [
        *FLAGS,
        f"--user-data-dir={site.root / 'chromium-profile'}",
        f"--window-size={WIDTH},{HEIGHT}",
    ]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    yield driver
    driver.quit()


def js(driver, script: str, *args):
    return driver.execute_script(script, *args)


def text_of(driver, selector: str) -> str:
    return js(
        driver,
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
        selector,
    )


def row(device_id: str) -> str:
    return f'[data-device="{device_id}"]'


def sign_in(driver, url: str, token: str) -> None:
    driver.get(url + "/")
    box = driver.find_element(By.ID, "token-input")
    wait_until(box.is_displayed, 10, "the token prompt")
    box.send_keys(token)
    driver.find_element(By.ID, "login-button").click()
    wait_until(
        lambda: js(driver, "return !document.getElementById('app').hidden"),
        15,
        "the dashboard to load",
    )


def signed_in(driver, url: str, token: str) -> None:
    """Make sure the page shows the dashboard for `token`: the tests below tell
    one story in order, but each can also run alone (pytest -k)."""
    try:
        current = js(driver, "return sessionStorage.getItem('rc_token')")
    except WebDriverException:  # no page of ours loaded yet
        current = None
    if current and not driver.current_url.startswith(url + "/"):
        current = None  # another controller's page: sign in on this one's
    if current:
        # a fresh page: nothing an earlier test left open (a dialog) is in the way
        driver.refresh()
        wait_until(
            lambda: js(driver, "return !document.getElementById('app').hidden"),
            15,
            "the dashboard to load again",
        )
        if current == token:
            return
        click(driver, "#signout")
    sign_in(driver, url, token)


def click(driver, selector: str) -> None:
    """Click the first visible match (retried: live updates replace elements)."""

    def attempt() -> bool:
        for el in driver.find_elements(By.CSS_SELECTOR, selector):
            if el.is_displayed():
                el.click()
                return True
        return False

    wait_until(attempt, 10, f"a click on {selector}")


def test_the_page_is_one_self_contained_file(site):
    with urllib.request.urlopen(site.ctl.url + "/", timeout=10) as r:  # no token needed
        html = r.read().decode()
        csp = r.headers["Content-Security-Policy"]
        assert r.headers["Content-Type"].startswith("text/html")
        assert r.headers["Cache-Control"] == "no-store"
    script = re.search(r"<script>(.*)</script>", html, re.DOTALL).group(1)
    style = re.search(r"<style>(.*)</style>", html, re.DOTALL).group(1)
    digest = lambda s: base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()
    assert f"script-src 'sha256-{digest(script)}'" in csp
    assert f"style-src 'sha256-{digest(style)}'" in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", html)  # nothing to fetch
    assert re.findall(r"\b(?:src|href)=\"([^\"]*)\"", html) == ["data:,"]
    code = (STATIC / "dashboard.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in code, f"dashboard.js uses {sink}"
    assert "localStorage" not in code and "sessionStorage.setItem(TOKEN_KEY" in code


def test_loads_with_a_token_and_lists_the_devices(site, browser):
    sign_in(browser, site.ctl.url, site.alice)
    wait_until(
        lambda: (
            "Free" in text_of(browser, row("box:cpu0"))
            and "Free" in text_of(browser, row("box:cpu1"))
        ),
        15,
        "both devices, free",
    )
    assert "alice" in text_of(browser, "#who")
    assert "2 of 2 devices free" in text_of(browser, "#summary")
    assert js(browser, "return sessionStorage.getItem('rc_token')") == site.alice
    assert js(browser, "return localStorage.length") == 0
    wait_until(lambda: text_of(browser, "#conn") == "Live", 10, "the live stream")


def test_a_running_job_shows_with_its_log_and_ends_without_a_reload(site, browser, tmp_path):
    signed_in(browser, site.ctl.url, site.alice)
    flag = tmp_path / "finish"
    alice = site.ctl.client(site.alice)
    script = (
        f"echo started-marker; while [ ! -e {flag} ]; do sleep 0.05; done; echo finished-marker"
    )
    job_id = alice.post("/v1/jobs", {"command": ["sh", "-c", script], "device_id": "box:cpu0"})[
        "job"
    ]["id"]
    js(browser, "window.__sameDocument = 'yes';")
    wait_until(
        lambda: (
            "In use" in (t := text_of(browser, row("box:cpu0")))
            and "alice" in t
            and f"job {job_id}" in t
        ),
        20,
        "the job on its device row",
    )
    assert f"#{job_id}" in text_of(browser, "#mine")
    assert f"#{job_id}" in text_of(browser, "#running")
    click(browser, f"{row('box:cpu0')} button.ref")
    wait_until(lambda: "started-marker" in text_of(browser, "pre.log"), 20, "the live log tail")
    assert f"job {job_id}" in text_of(browser, "#drawer-title")
    assert "Running on box:cpu0" in text_of(browser, "#drawer-body")

    flag.touch()
    wait_until(
        lambda: "Free" in text_of(browser, row("box:cpu0")), 20, "the device to be free again"
    )
    wait_until(
        lambda: f"#{job_id}" in (t := text_of(browser, "#recent")) and "succeeded" in t,
        10,
        "the job among recent jobs",
    )
    wait_until(
        lambda: (
            "finished-marker" in text_of(browser, "pre.log")
            and "Succeeded" in text_of(browser, "#drawer-body")
        ),
        10,
        "the panel to show the end",
    )
    assert js(browser, "return window.__sameDocument") == "yes", "the page reloaded"
    assert job(site.ctl.client(), job_id)["state"] == "succeeded"
    click(browser, "#drawer-close")


def test_a_device_lists_its_running_job_by_what_it_runs_and_kills_in_words(site, browser, tmp_path):
    """Report 7: a running job among a device's "Recent jobs here" read
    "20788d 8h ago" (aged from the finished_at it does not have yet). Report
    15: a copy was listed by its sh -c script, a cancel as "killed by admin".
    The admin token's label names its Unix user (root) and the token."""
    signed_in(browser, site.ctl.url, site.alice)
    alice = site.ctl.client(site.alice)
    title = "rc cp ./data box:cpu0:/tmp/"
    # a copy's own command (rc.proto.copyjob): the controller labels it; the
    # test holds the client's halves (and sends no archive: nothing lands)
    running = alice.post(
        "/v1/jobs",
        {
            "command": copyjob.upload_command("/tmp/", "data", "./data"),
            "device_id": "box:cpu0",
            "stdio": "pipe",
        },
    )["job"]["id"]
    up = Upload(alice, f"/v1/jobs/{running}/tty/in")
    down = Download(alice, f"/v1/jobs/{running}/tty/out")
    try:
        queued = alice.post("/v1/jobs", {"command": ["true"], "device_id": "box:cpu0"})["job"]
        assert queued["state"] == "queued"
        site.ctl.client().post(f"/v1/jobs/{queued['id']}/kill")  # the admin cancels it
        wait_until(
            lambda: f"job {running}" in (t := text_of(browser, row("box:cpu0"))) and title in t,
            20,
            "the copy on its device row, by what it runs",
        )
        wait_until(lambda: title in text_of(browser, "#running"), 10, "the copy among running jobs")
        wait_until(
            lambda: (
                "by root (token admin), an admin: cancelled while queued"
                in text_of(browser, "#recent")
            ),
            10,
            "the cancel among recent jobs, in words",
        )
        click(browser, row("box:cpu0"))
        item = f'#drawer-body [data-job="{running}"]'
        wait_until(lambda: text_of(browser, item), 10, "the device's recent jobs")
        text = text_of(browser, item)
        assert "running" in text and title in text, text
        assert re.search(r"\bfor \d+s\b", text) and "ago" not in text, text
        cancelled = text_of(browser, f'#drawer-body [data-job="{queued["id"]}"]')
        assert "by root (token admin), an admin: cancelled while queued" in cancelled
        assert "killed (killed by" not in cancelled, cancelled
        up.close()  # the copy's pipe closes: the job ends
        down.close()
        wait_until(lambda: "Free" in text_of(browser, row("box:cpu0")), 20, "the device to be free")
        click(browser, "#drawer-close")
    finally:
        up.close()
        down.close()
    # the trial: a plain job whose reason said "rc cp ..." was listed as a
    # copy, its command hidden. A reason goes beside the command; "rc cp" is
    # the controller's word only (it drops a client's)
    flag = tmp_path / "finish"
    command = ["sh", "-c", f"while [ ! -e {flag} ]; do sleep 0.05; done # evil"]
    fake = alice.post("/v1/jobs", {"command": command, "device_id": "box:cpu0", "reason": title})[
        "job"
    ]
    assert fake["reason"] == ""
    plain = alice.post(
        "/v1/jobs", {"command": ["sleep", "30.25"], "device_id": "box:cpu1", "reason": "ablation 3"}
    )["job"]["id"]
    wait_until(
        lambda: "# evil" in text_of(browser, row("box:cpu0")), 20, "the fake copy by its command"
    )
    assert title not in text_of(browser, "#running")
    wait_until(
        lambda: "sleep 30.25 (ablation 3)" in text_of(browser, row("box:cpu1")),
        20,
        "a job's reason beside its command",
    )
    alice.post(f"/v1/jobs/{plain}/kill")
    flag.touch()
    for device in ("box:cpu0", "box:cpu1"):
        wait_until(lambda: "Free" in text_of(browser, row(device)), 20, f"{device} to be free")


def test_a_hostile_label_is_shown_as_text(site, browser):
    signed_in(browser, site.ctl.url, site.alice)
    chips = js(
        browser,
        "return [...document.querySelectorAll(arguments[0] + ' .chip')].map(c => c.textContent)",
        row("box:cpu1"),
    )
    assert HOSTILE in chips
    click(browser, row("box:cpu1"))
    wait_until(lambda: HOSTILE in text_of(browser, "table.labels"), 10, "the labels table")
    assert js(browser, "return document.querySelectorAll('img').length") == 0
    assert js(browser, "return window.__pwned === undefined")
    # a user token sees no admin action
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-action=clear], [data-action=retire]")
    click(browser, "#drawer-close")


def test_an_admin_returns_a_quarantined_device_to_the_pool(site, browser):
    signed_in(browser, site.ctl.url, site.alice)
    signed_in(browser, site.ctl.url, site.ctl.admin_token)  # signs alice out
    admin = site.ctl.client()
    admin.post("/v1/devices/box:cpu1/fault", {"reason": "verify failed: ECC errors on bank 3"})
    wait_until(
        lambda: (
            "Out of the pool" in (t := text_of(browser, row("box:cpu1")))
            and "verify failed: ECC errors on bank 3" in t
        ),
        15,
        "the quarantine on its row",
    )
    assert "Its worker reported a fault" in text_of(browser, row("box:cpu1"))
    wait_until(lambda: "Verify failed" in text_of(browser, "#feed"), 10, "the feed entry")
    click(browser, row("box:cpu1"))
    click(browser, "[data-action=clear]")
    wait_until(
        lambda: "Return box:cpu1 to the pool?" in text_of(browser, "#confirm"),
        5,
        "the confirmation",
    )
    assert device_state(admin, "box:cpu1") == "unhealthy"  # nothing happens before confirming
    click(browser, "#confirm-ok")
    try:
        wait_until(
            lambda: (
                js(
                    browser,
                    "return document.querySelector(arguments[0]).dataset.state",
                    row("box:cpu1"),
                )
                == "ready"
            ),
            15,
            "the device back in the pool",
        )
    except AssertionError as e:  # once seen under heavy load: say what each side shows
        raise AssertionError(
            f"{e}; the controller says {device_state(admin, 'box:cpu1')!r}; the dialog says "
            f"{text_of(browser, '#confirm')!r}; the row says {text_of(browser, row('box:cpu1'))!r}"
        ) from None
    assert "Free" in text_of(browser, row("box:cpu1"))
    assert device_state(admin, "box:cpu1") == "ready"
    wait_until(lambda: "Returned to pool" in text_of(browser, "#feed"), 10, "the feed entry")
    click(browser, "#drawer-close")


def test_screenshot(site, browser, tmp_path):
    signed_in(browser, site.ctl.url, site.ctl.admin_token)
    alice = site.ctl.client(site.alice)
    hold = alice.post(
        "/v1/jobs",
        {
            "kind": "hold",
            "device_id": "box:cpu0",
            "max_runtime_seconds": 7200,
            "reason": "debugging a NCCL hang",
        },
    )
    alice.post("/v1/jobs", {"command": ["python3", "train.py"], "device_id": "box:cpu0"})
    site.ctl.client().post("/v1/devices/box:cpu1/fault", {"reason": "fan failure reported by BMC"})
    wait_until(
        lambda: (
            "In use" in text_of(browser, row("box:cpu0"))
            and "Out of the pool" in text_of(browser, row("box:cpu1"))
            and "No matching device is free" in text_of(browser, "#queue")
        ),
        20,
        "the scene to render",
    )
    path = tmp_path / "dashboard.png"
    assert browser.save_screenshot(str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    expected = js(
        browser,
        "return [Math.round(innerWidth * devicePixelRatio), "
        "Math.round(innerHeight * devicePixelRatio)]",
    )
    assert [width, height] == expected
    assert width >= 1200 and height >= 700
    assert len(data) > 20_000  # a rendered page, not a blank one
    alice.post(f"/v1/jobs/{hold['job']['id']}/kill")


def test_an_admin_acting_for_a_user_is_in_the_feed_in_words(site, browser):
    """The feed's word for submitted_as: the script's own copy of the words
    had none (rc.controller.wording is now the one table)."""
    signed_in(browser, site.ctl.url, site.ctl.admin_token)
    job_id = site.ctl.client().post(
        "/v1/jobs", {"command": ["true"], "device_id": "box:cpu0", "as_user": "token:alice"}
    )["job"]["id"]
    wait_until(
        lambda: (
            f"root (token admin) submitted job {job_id} as alice (token alice)"
            in text_of(browser, "#feed")
        ),
        15,
        "the submitted_as event in the feed",
    )
    entry = js(
        browser,
        "return [...document.querySelectorAll('#feed li')].map(e => e.innerText)"
        ".find(t => t.includes(arguments[0]))",
        f"submitted job {job_id} as",
    )
    assert "Submitted as" in entry and "submitted_as" not in entry, entry


END_REASONS = [
    ("", 0.0),
    ("", 5.0),
    ("killed by root", 0.0),
    ("killed by root", 5.0),
    ("killed by ann (admin)", 5.0),
    ("killed by ann: released (Ctrl-C)", 5.0),
    ("killed by ann (admin): token revoked", 0.0),
    ("killed by bob: killed by rc run (SIGTERM)", 5.0),
    ("killed by alice (token laptop): released", 5.0),  # a token's label
    ("killed by root (token admin) (admin): disk full", 5.0),
    ("idle: no output for 5m", 5.0),
    ("max_runtime exceeded (2h)", 5.0),
    ("signal: SIGKILL", 5.0),
    ("no-wait: no device was free", 0.0),
    ("lease expired", 5.0),
    ("hold ended: its ttl of 1h was reached", 5.0),
    ("  killed by x:   spaced  ", 5.0),
    ("killed by x: line one\nline two", 5.0),
]


def test_the_page_words_an_end_reason_as_the_cli_does(site, browser):
    """dashboard.js's endReason is a second implementation of
    rc.cli.output.end_reason (the page words a kill the way `rc jobs`
    does): run the page's own code in the browser on a table of reasons."""
    from rc.cli.output import end_reason

    signed_in(browser, site.ctl.url, site.alice)
    code = (STATIC / "dashboard.js").read_text()
    source = code[code.index("  const KILLED_BY") : code.index("  function stripAnsi")]
    got = js(
        browser,
        source
        + "; return arguments[0].map(([r, s]) => endReason({kill_reason: r, started_at: s}));",
        END_REASONS,
    )
    want = [end_reason({"kill_reason": r, "started_at": s}) for r, s in END_REASONS]
    assert got == want


SHOWN_TEXTS = [
    "plain text, spaces and ünïcödé · … —",
    "multi\nline\ttab\rreturn",
    "\x1b[31mred\x07\x7f\x9b2J\x00",
    "\u202eevil\u200b\u2028\u2029\u00a0nbsp\ufeff",
    "\ue000private \U000e0001tag \U0001f600 smile",
    "back\\slash 'quotes' \"double\"",
]


def test_the_page_escapes_other_peoples_text_as_the_cli_does(site, browser):
    """The trial: the dashboard drew a hold reason's raw control characters
    (the CLI shows them as escapes). dashboard.js's visible and
    escapeControls are second implementations of rc.cli.output.visible and
    escape_controls: run the page's own code on a table of texts, then see
    a hold reason full of them on its device row."""
    from rc.cli.output import escape_controls, visible

    signed_in(browser, site.ctl.url, site.alice)
    code = (STATIC / "dashboard.js").read_text()
    source = code[code.index("  const INVISIBLE") : code.index("  function icon(")]
    got = js(
        browser,
        source + "; return arguments[0].map((t) => [visible(t), escapeControls(t)]);",
        SHOWN_TEXTS,
    )
    assert got == [[visible(t), escape_controls(t)] for t in SHOWN_TEXTS]
    alice = site.ctl.client(site.alice)
    evil = "notes\r\nFORGED \x1b[31mred\u202eevil"
    hold = alice.post(
        "/v1/jobs",
        {"kind": "hold", "selector": "*", "max_runtime_seconds": 600, "reason": evil},
    )["job"]["id"]
    try:
        wait_until(lambda: job(alice, hold)["state"] == "running", 20, "the hold")
        device = job(alice, hold)["device_id"]
        shown = visible(evil)
        assert shown == "notes\\r\\nFORGED \\x1b[31mred\\u202eevil"
        wait_until(lambda: shown in text_of(browser, row(device)), 20, "the reason, escaped")
        text = text_of(browser, row(device))
        assert "\x1b" not in text and "\u202e" not in text and "FORGED \x1b" not in text
    finally:
        alice.post(f"/v1/jobs/{hold}/kill")


def test_a_holds_idle_clock_says_its_ttl_ends_it_first(site, browser):
    """The trial: the idle clock said "released at 14:30 if unused" for a
    hold whose ttl ended it at 13:40. It shows whichever ends the hold first."""
    signed_in(browser, site.ctl.url, site.alice)
    alice = site.ctl.client(site.alice)
    hold = alice.post(
        "/v1/jobs",
        {
            "kind": "hold",
            "selector": "*",
            "max_runtime_seconds": 600,
            "reason": "short",
            "hold_idle_timeout_seconds": 3600,
        },
    )["job"]["id"]
    try:
        wait_until(lambda: job(alice, hold)["state"] == "running", 20, "the hold")
        device = job(alice, hold)["device_id"]
        wait_until(
            lambda: re.search(
                r"idle \d+s · its ttl ends first, at (\S+ \S+ \d\d? )?\d\d?:\d\d(:\d\d)?( [AP]M)?",
                text_of(browser, row(device)),
            ),
            20,
            f"the idle clock of hold {hold}, ended by its ttl",
        )
        assert "if unused" not in text_of(browser, row(device))
    finally:
        alice.post(f"/v1/jobs/{hold}/kill")


def test_a_hold_shows_its_idle_clock_and_when_it_is_released(site, browser):
    """README "Holds: the idle rule": the device row of a hold under the rule."""
    signed_in(browser, site.ctl.url, site.alice)
    alice = site.ctl.client(site.alice)
    hold = alice.post(
        "/v1/jobs",
        {
            "kind": "hold",
            "selector": "*",  # earlier tests may have left one device out of the pool
            "max_runtime_seconds": 7200,
            "reason": "notebook",
            "hold_idle_timeout_seconds": 3600,
        },
    )
    try:
        wait_until(lambda: job(alice, hold["job"]["id"])["state"] == "running", 20, "the hold")
        device = job(alice, hold["job"]["id"])["device_id"]
        wait_until(
            lambda: re.search(
                # a time on another day comes with its date ("Wed, Dec 2 00:41 AM"):
                # from 23:00 on, an hour's timeout ends tomorrow
                r"idle \d+s · released at (\S+ \S+ \d\d? )?\d\d?:\d\d(:\d\d)?( [AP]M)? if unused",
                text_of(browser, row(device)),
            ),
            20,
            f"the idle clock of hold {hold['job']['id']}",
        )
    finally:
        alice.post(f"/v1/jobs/{hold['job']['id']}/kill")


def _signed_in_as(driver, name: str) -> None:
    wait_until(
        lambda: (
            js(driver, "return !document.getElementById('app').hidden")
            and name in text_of(driver, "#who")
        ),
        15,
        f"the dashboard signed in as {name}",
    )


def test_a_link_from_rc_dashboard_signs_a_socket_user_in_once(
    site, browser, unix_users, public_pyz
):
    """A user of the local socket has no token to paste: `rc dashboard`
    prints a link whose one-time code signs the tab in as that Unix user;
    the code leaves the address bar, and the same link fails a second time."""
    user = TEST_USERS[0]
    cli = UserCli(user, public_pyz, {"RC_SOCKET": site.ctl.socket})
    res = cli.run("dashboard")
    assert res.returncode == 0, res.stderr
    link = res.stdout.decode().strip()
    assert link.startswith(site.ctl.url + "/#code=rcc_"), link
    assert (
        res.stderr == b"rc: open this link within 120 s: it signs one browser tab in as you, once\n"
    )
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    try:
        browser.get(link)
        _signed_in_as(browser, user)
        assert "code" not in browser.current_url
        assert js(browser, "return location.hash") == ""
        token = js(browser, "return sessionStorage.getItem('rc_token')")
        assert token and token != site.alice and "rcc_" not in token
        assert Client(site.ctl.url, token).get("/v1/whoami")["name"] == user
        browser.switch_to.new_window("tab")  # a tab of its own: nothing signed in
        browser.get(link)
        wait_until(lambda: "did not work" in text_of(browser, "#login-error"), 15, "the refusal")
        assert "already used" in text_of(browser, "#login-error")
        assert js(browser, "return document.getElementById('app').hidden")
        assert "code" not in browser.current_url
    finally:
        for handle in browser.window_handles:
            if handle != first:
                browser.switch_to.window(handle)
                browser.close()
        browser.switch_to.window(first)


def test_rc_dashboard_open_hands_the_browser_a_private_file_not_the_code(
    site, browser, unix_users, public_pyz, tmp_path
):
    """`rc dashboard --open` starts $BROWSER on a 0600 page of the user's
    that forwards to the link: no command line carries the code."""
    user = TEST_USERS[0]
    where = Path(tempfile.mkdtemp(prefix="rc-browser-", dir="/tmp"))
    try:
        where.chmod(0o777)
        record = where / "browser"
        record.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {where}/argv\n')
        record.chmod(0o755)
        env = {"RC_SOCKET": site.ctl.socket, "BROWSER": f"{record} %s"}
        res = UserCli(user, public_pyz, env).run("dashboard", "--open")
        assert res.returncode == 0, res.stderr
        link = res.stdout.decode().strip()
        argv = (where / "argv").read_text()
        assert "rcc_" not in argv and argv.startswith("file:///"), argv
        page = Path(urllib.parse.unquote(urllib.parse.urlsplit(argv.strip()).path))
        st = page.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (pwd.getpwnam(user).pw_uid, 0o600)
        assert html.escape(link) in page.read_text()
        first = browser.current_window_handle
        browser.switch_to.new_window("tab")
        try:
            browser.get(argv.strip())  # what the browser was started on
            _signed_in_as(browser, user)
            assert "code" not in browser.current_url
        finally:
            browser.close()
            browser.switch_to.window(first)
    finally:
        shutil.rmtree(where, ignore_errors=True)


def test_the_page_says_stale_when_the_controller_goes_away(site, browser):
    signed_in(browser, site.ctl.url, site.ctl.admin_token)
    wait_until(lambda: text_of(browser, "#conn") == "Live", 10, "the live stream")
    site.worker.stop()  # while its controller can still take its last reports
    site.ctl.stop()
    wait_until(lambda: text_of(browser, "#conn").startswith("Stale"), 20, "the stale mark")
    assert js(browser, "return !document.getElementById('stale-banner').hidden")
    assert "cannot be reached" in text_of(browser, "#stale-banner")
    assert js(browser, "return document.body.classList.contains('stale')")


def test_the_usage_view_draws_the_right_bars_for_a_known_history(browser, tmp_path, env):
    """A history made on the in-process controller's clock (two and one days
    ago), then served by a real rc serve: the page draws one bar per user and
    day with the ledger's device-seconds, bob's 3 device-hours 1.5 times as
    tall as alice's 2; the usage view is screenshotted."""
    from tests.helpers.inprocess import Lab
    from tests.helpers.usage_history import _known_days

    data = tmp_path / "history"
    today = time.time() // 86400 * 86400
    lb = Lab(data)
    try:
        _known_days(lb, today)
    finally:
        lb.close()
    ctl = Controller(data, env).start()
    try:
        signed_in(browser, ctl.url, ctl.admin_token)
        day = lambda k: time.strftime("%Y-%m-%d", time.gmtime(today - k * 86400))
        bar = '#usage rect[data-day="{}"][data-user="{}"]'

        def bars():
            got = js(
                browser,
                "return [...document.querySelectorAll('#usage rect[data-user]')].map("
                "r => [r.dataset.day, r.dataset.user, +r.dataset.seconds, +r.getAttribute('height')])",
            )
            return got or None

        got = wait_until(bars, 20, "the usage picture")
        assert {(d, u): s for d, u, s, _ in got} == {
            (day(2), "alice"): 7200,
            (day(1), "bob"): 10800,
            (day(1), "carol"): 600,
        }
        height = {(d, u): h for d, u, _, h in got}
        assert height[(day(1), "bob")] / height[(day(2), "alice")] == pytest.approx(1.5)
        assert js(browser, f"return !!document.querySelector('{bar.format(day(1), 'bob')} title')")
        assert js(browser, "return window.__pwned === undefined")
        js(browser, "document.getElementById('usage').scrollIntoView()")
        path = tmp_path / "usage.png"
        assert browser.save_screenshot(str(path))
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finally:
        ctl.stop()
