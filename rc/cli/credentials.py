"""The tokens `rc up` makes and the client config it writes.

`rc up` gives its worker a worker token bound to this host (kept in the data
directory, 0600) and points the client config file (~/.config/rc/config.toml)
at its controller with a user token named after the person running it, so a
plain `rc run` works next. A config file that names another controller is
left alone with a note; one that cannot be read is kept aside and rewritten.
"""

from __future__ import annotations

import getpass
import os
import re
from pathlib import Path

from rc.cli import config as client_config
from rc.cli.context import stderr
from rc.proto import calls
from rc.proto.client import Client, parse_controller_url, parse_controller_urls
from rc.proto.errors import ApiError, RcError

__all__ = ["ensure_client_config", "ensure_token", "worker_token_host", "write_secret"]


def _token_name(base: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._@-]", "-", base).strip("-.") or "user"
    return name[:48]


def ensure_token(admin, name: str, role: str) -> str:
    """The secret of a fresh worker token named `name` (one of that name is
    replaced: the data dir's worker token is made for its host)."""
    try:
        return admin.call(calls.TOKEN_CREATE, body={"name": name, "role": role})["secret"]
    except ApiError as e:
        if e.code != "token_exists":
            raise
    admin.call(calls.TOKEN_REVOKE, name)
    return admin.call(calls.TOKEN_CREATE, body={"name": name, "role": role})["secret"]


def _user_token(admin, name: str, unix_user: str) -> tuple[str, str]:
    """A user token named `name` for the client config, whose jobs run as
    `unix_user` (the user running rc up; "": the name), and words for the
    message. An existing live user token of that name (the one a lost or
    broken config held) gets a new secret (POST /v1/tokens/NAME/rotate): it
    stays the same principal, so its jobs stay the user's own and no token
    piles up. A token of that name with another role (an admin token named
    after the user) is left alone and the first free name like it is used,
    which the words say. Raises RcError when there is none."""
    held = {t["name"]: t["role"] for t in admin.call(calls.TOKENS)["tokens"] if not t["revoked_at"]}
    body = {"role": "user", "unix_user": unix_user} if unix_user else {"role": "user"}
    if held.get(name, "user") == "user":
        if name in held:
            secret = admin.call(calls.TOKEN_ROTATE, name)["secret"]
            return secret, (
                f"a new secret for token {name}, which keeps its jobs; the old one stops working"
            )
        made = admin.call(calls.TOKEN_CREATE, body={"name": name, **body})
        return made["secret"], f"a user token for {name}"
    for n in range(1, 100):
        candidate = f"{name}-{n}"
        if candidate not in held:
            secret = admin.call(calls.TOKEN_CREATE, body={"name": candidate, **body})["secret"]
            return secret, f"a user token for {candidate}: {name} is a {held[name]} token"
    raise RcError(f"could not find a free token name like {name!r}")


def _login_name() -> str:
    """The Unix user running rc up, whose jobs its user token runs ("" when
    the password database does not know this uid)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return ""


def write_secret(path: Path, secret: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")


def _token_works(url: str, token: str) -> bool:
    """Whether `token` is a live token of the controller at `url`."""
    if not token:
        return False
    try:
        Client(url, token, timeout=10).call(calls.WHOAMI)
        return True
    except (RcError, ValueError):
        return False


def worker_token_host(url: str, token_file: Path) -> str | None:
    """The host the worker token in `token_file` is bound to ("" while not
    yet bound), or None when the file holds no worker token of the controller
    at `url` (missing, empty, or refused with 401). Other errors raise."""
    try:
        token = token_file.read_text().strip()
    except FileNotFoundError:
        return None
    if not token or not token.isascii() or not token.isprintable():
        return None
    try:
        me = Client(url, token, timeout=10).call(calls.WHOAMI)
    except ApiError as e:
        if e.status == 401:
            return None
        raise
    return (me.get("host") or "") if me.get("role") == "worker" else None


def names_controller(text: str, url: str) -> bool:
    """Whether `text` (a controller URL or a comma-separated list of them, as in
    RC_CONTROLLER or the config file) names the controller at `url`: it is
    `url` or one of the list (compared parsed, so "http://h:80/" is
    "http://h"). False for empty or malformed text."""
    if not text:
        return False
    try:
        return parse_controller_url(url) in parse_controller_urls(text)
    except RcError:
        return text.strip() == url


def ensure_client_config(admin, url: str) -> bool:
    """Make the client config file (~/.config/rc/config.toml) point at `url`
    with a token that works there, unless it points at another controller
    that rc up did not start (then only a note). Written when missing,
    unreadable or corrupt (a corrupt one is kept as config.toml.broken), or
    when it names this controller with a token it does not know. Returns
    whether a plain `rc` command here talks to `url`. A config file or
    RC_CONTROLLER naming a list of controllers that holds `url` names this
    controller (the list is kept); a list without it is another controller's."""
    cfg_path = client_config.config_path()
    named = os.environ.get("RC_CONTROLLER", "").strip()
    points_here = not named or names_controller(named, url)
    problem = client_config.file_problem(cfg_path)
    existing = client_config.read_file(cfg_path) if problem is None else {}

    def write(what: str, controller: str = url) -> None:
        user_token, words = _user_token(admin, _token_name(getpass.getuser()), _login_name())
        client_config.write_config(cfg_path, controller, user_token, existing.get("cacert", ""))
        stderr(f"{what} (controller {controller}, {words})")

    if problem == "missing":
        write(f"wrote {cfg_path}")
    elif problem is not None:
        broken = cfg_path.with_name(cfg_path.name + ".broken")
        try:
            os.replace(cfg_path, broken)
        except OSError as e:
            stderr(f"note: {cfg_path} cannot be read ({problem}) nor moved aside: {e.strerror}")
            return False
        write(f"rewrote {cfg_path}, which could not be read ({problem}; kept as {broken})")
    elif not existing.get("controller") and not existing.get("token"):
        write(f"rewrote {cfg_path}, which named neither controller nor token")
    elif names_controller(existing.get("controller", ""), url):
        if not _token_works(url, existing.get("token", "")):
            write(
                f"rewrote {cfg_path}: its token is not one of this controller's",
                existing["controller"],
            )
    elif "," not in existing.get("controller", "") and _token_works(url, existing.get("token", "")):
        # the config holds a token of this very controller: it just moved
        client_config.write_config(cfg_path, url, existing["token"], existing.get("cacert", ""))
        stderr(f"updated {cfg_path}: the controller is now at {url}")
    elif names_controller(
        named, url
    ):  # RC_CONTROLLER names this one: the file's controller is not used
        if not os.environ.get("RC_TOKEN", "").strip():
            stderr(
                f"note: RC_CONTROLLER names this controller, but the token in {cfg_path} "
                f"is for {existing.get('controller', 'another controller')}: set RC_TOKEN too"
            )
    else:
        points_here = False
        stderr(
            f"note: {cfg_path} points at {existing.get('controller', 'nothing')}, "
            f"not {url}; set RC_CONTROLLER or edit it"
        )
    return points_here
