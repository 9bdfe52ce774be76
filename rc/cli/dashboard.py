"""`rc dashboard`: a one-time link that signs a browser in to the dashboard
as you (README "Dashboard and metrics").

A user of the controller's local socket has no token to paste into the
dashboard's login card (rc keeps the socket's tokens to itself), and a user
with a token would rather not paste it. `rc dashboard` asks the controller,
as whoever runs it, for a one-time code (POST /v1/dashboard/code: valid
120 s, once) and prints the dashboard's address with the code in its
fragment, `http://HOST:PORT/#code=rcc_...`; the page spends the code for a
session acting as you and removes it from the address bar.

With --open it starts a browser (the standard library's webbrowser, which
honours $BROWSER) on a small page written, mode 0600, into the user's
private runtime directory (the one rc caches the socket's token in), which
forwards to that address: so the code never appears on a command line,
where every user of the machine could read it in `ps` (Jupyter opens its
token the same way).
"""

from __future__ import annotations

import argparse
import html
import os
import secrets
import time
from pathlib import Path

from rc.cli.context import add_client_flags, client, stderr
from rc.proto import calls
from rc.proto.errors import RcError

__all__ = ["REDIRECT_KEEP_S", "add_parsers", "cmd_dashboard", "write_redirect"]

REDIRECT_KEEP_S = 600.0
"""A forwarding page older than this (s) is removed by the next `rc
dashboard --open` (its code expired long ago)."""


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "dashboard",
        help="a one-time link that opens the dashboard signed in as you",
        description="Print the dashboard's address with a one-time code in it: "
        "opened within 120 s, in a browser that can reach the controller, it signs "
        "that browser tab in as you (the same identity as this rc: your token, or "
        "your Unix user on the controller's own machine). The code works once; the "
        "session lasts at most 12 hours and never past your own token.",
    )
    p.add_argument(
        "--open",
        action="store_true",
        help="also open it in a browser here ($BROWSER, else the desktop's default), "
        "through a private file so that the code is never on a command line",
    )
    add_client_flags(p)
    p.set_defaults(handler="dashboard:cmd_dashboard")


def cmd_dashboard(args: argparse.Namespace) -> int:
    """`rc dashboard [--open]`: the link on stdout, what it is on stderr."""
    c = client(args, timeout=30)
    got = c.call(calls.DASHBOARD_CODE)
    link = f"{c.url}/#code={got['code']}"
    print(link, flush=True)
    within = f"{got['expires_in_seconds']:g} s"
    if not args.open:
        stderr(f"open this link within {within}: it signs one browser tab in as you, once")
        return 0
    import webbrowser

    page = write_redirect(link)
    if not webbrowser.open(page.as_uri()):
        stderr(f"no browser could be started here; open the link above within {within}")
        return 1
    stderr(f"opened the dashboard in a browser (the link above works once, within {within})")
    return 0


def write_redirect(link: str) -> Path:
    """A page, mode 0600 in the user's private runtime directory
    (rc.cli.localsocket.cache_dir), that forwards a browser to `link`; older
    ones (REDIRECT_KEEP_S) are removed. Raises RcError when there is no such
    directory to write it in safely."""
    from rc.cli.localsocket import cache_dir

    where = cache_dir()
    if where is None:
        raise RcError("no private directory to pass the link to a browser; open the link above")
    now = time.time()
    for old in where.glob("dashboard-*.html"):
        try:
            if now - old.lstat().st_mtime > REDIRECT_KEEP_S:
                old.unlink()
        except OSError:
            pass
    quoted = html.escape(link, quote=True)
    body = (
        '<!doctype html>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="refresh" content="0;url={quoted}">\n'
        "<title>rc dashboard</title>\n"
        f'<p><a href="{quoted}">Open the rc dashboard</a></p>\n'
    )
    path = where / f"dashboard-{secrets.token_hex(8)}.html"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(body)
    except OSError as e:
        raise RcError(f"cannot write {path}: {e.strerror or e}; open the link above") from None
    return path
