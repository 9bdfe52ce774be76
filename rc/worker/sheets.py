"""Usage sheets: notes for the people who use a host's devices.

`<sheet_dir>/host.md` is host-wide, `<sheet_dir>/host.d/<device>.md` is one
device's. They are sent at registration and with every labels push; the
controller stores them and `rc describe` shows them. A missing file is sent as
"" (the note was removed); a file that cannot be read is not sent at all (the
stored copy stays: host.md as None, a device's by leaving its key out). A
sheet over 64 KiB is cut on a UTF-8 character boundary and ends with a marker
line, so it always fits the controller's limit.
"""

from __future__ import annotations

import os

__all__ = ["SHEET_MAX_BYTES", "TRUNCATED_MARKER", "fit", "read_sheets"]

SHEET_MAX_BYTES = 64 << 10
"""The controller's limit per sheet, marker included."""
TRUNCATED_MARKER = "\n[rc: this sheet was cut at 64 KiB]\n"


def fit(data: bytes, limit: int = SHEET_MAX_BYTES) -> str:
    """`data` as text of at most `limit` UTF-8 bytes: whole if it fits, else
    cut on a character boundary with TRUNCATED_MARKER appended. Invalid UTF-8
    becomes U+FFFD."""
    text = data.decode("utf-8", "replace")
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    cut = limit - len(TRUNCATED_MARKER.encode())
    while cut > 0 and (raw[cut] & 0xC0) == 0x80:  # inside a multi-byte character
        cut -= 1
    return raw[:cut].decode("utf-8") + TRUNCATED_MARKER


def _read(path: str) -> str | None:
    """ "" for a missing file, None when it cannot be read, else its text."""
    try:
        with open(path, "rb") as f:
            return fit(f.read(SHEET_MAX_BYTES * 4 + 4))
    except FileNotFoundError:
        return ""
    except OSError:
        return None


def read_sheets(sheet_dir: str, devices: list[str]) -> tuple[str | None, dict[str, str]]:
    """(host sheet or None, {device: sheet}) for the labels payload."""
    host = _read(os.path.join(sheet_dir, "host.md"))
    per_device = {}
    for name in devices:
        body = _read(os.path.join(sheet_dir, "host.d", f"{name}.md"))
        if body is not None:
            per_device[name] = body
    return host, per_device
