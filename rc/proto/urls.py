"""Controller URLs: parsing one (or a comma-separated list of a controller
and its standbys) into ControllerURL records, and the TLS context of an
https one. Standard library only; rc.proto.client re-exports them."""

from __future__ import annotations

import ssl
import urllib.parse
from dataclasses import dataclass

from rc.proto.errors import RcError

MAX_CONTROLLER_URLS = 16


@dataclass(frozen=True, slots=True)
class ControllerURL:
    """A parsed controller address: scheme http or https, host, port, path prefix."""

    scheme: str
    host: str
    port: int
    prefix: str

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"


def parse_controller_url(text: str) -> ControllerURL:
    """Parse "http://host:port[/prefix]" (https too; port defaults 80/443).

    Raises RcError naming the problem for anything else.
    """
    raw = text.strip()
    if "://" not in raw:
        raise RcError(f"controller URL {text!r} has no scheme (expected http://HOST:PORT)")
    try:
        u = urllib.parse.urlsplit(raw)
        port = u.port
    except ValueError as e:
        raise RcError(f"controller URL {text!r} is not valid: {e}") from None
    if u.scheme not in ("http", "https"):
        raise RcError(f"controller URL {text!r}: scheme must be http or https")
    if not u.hostname:
        raise RcError(f"controller URL {text!r} has no host")
    if u.query or u.fragment or u.username or u.password:
        raise RcError(f"controller URL {text!r} may not carry a query, fragment or credentials")
    if port is None:
        port = 443 if u.scheme == "https" else 80
    return ControllerURL(u.scheme, u.hostname, port, u.path.rstrip("/"))


def parse_controller_urls(text: str) -> list[ControllerURL]:
    """Parse one controller URL or a comma-separated list of them (order =
    preference), at most MAX_CONTROLLER_URLS, each as parse_controller_url.

    Raises RcError naming the bad item: an empty item, a malformed URL, one
    listed twice, a list mixing http and https, or too many."""
    items = [item.strip() for item in text.split(",")]
    if len(items) == 1:
        return [parse_controller_url(text)]
    if len(items) > MAX_CONTROLLER_URLS:
        raise RcError(
            f"controller URL list {text!r} has {len(items)} URLs; at most {MAX_CONTROLLER_URLS}"
        )
    urls: list[ControllerURL] = []
    for n, item in enumerate(items, 1):
        if not item:
            raise RcError(f"controller URL list {text!r}: item {n} is empty")
        if item.startswith("unix://"):
            raise RcError(
                f"controller URL list {text!r}: item {n} ({item}) is a local socket; "
                "a unix:// address is given alone, not in a list"
            )
        url = parse_controller_url(item)
        if url in urls:
            raise RcError(f"controller URL list {text!r}: {url} is listed twice")
        urls.append(url)
    if len({u.scheme for u in urls}) > 1:
        raise RcError(f"controller URL list {text!r} mixes http and https; use one scheme")
    return urls


def tls_context(cacert: str | None) -> ssl.SSLContext:
    """A client TLS context verifying with `cacert` (a PEM file) or the system store.

    A CA file that is missing, unreadable or holds no certificate raises
    RcError naming the file and the problem (never a traceback)."""
    try:
        return ssl.create_default_context(cafile=cacert)
    except FileNotFoundError:
        raise RcError(f"CA file {cacert}: no such file") from None
    except IsADirectoryError:
        raise RcError(f"CA file {cacert}: is a directory, not a PEM file") from None
    except OSError as e:
        if isinstance(e, ssl.SSLError):
            why = e.reason or str(e)
            raise RcError(f"CA file {cacert}: not a PEM CA certificate ({why})") from None
        raise RcError(f"CA file {cacert}: cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise RcError(f"CA file {cacert}: not usable: {e}") from None
