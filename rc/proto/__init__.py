"""The shared language of rc: model records, wire records, codecs, HTTP client.

Standard library only: this package ships in dist/rc.pyz (docs/design.md#layering).
"""

INSTANCE_HEADER = "Rc-Controller-Instance"
"""Header on every response: a random id for this controller process.

Defined here rather than in rc.proto.wire so that the HTTP client (and so every
CLI command) does not pay for importing the wire records it never uses."""

VIA_HEADER = "Rc-Via"
"""Request header a client program sends to name itself on the writes it
makes for someone ("mcp" from `rc mcp`): the controller puts such a
submission or kill in the activity feed, "via mcp", with the caller's own
label as its actor. It grants nothing (the caller is still its token or its
socket user). A value is 1..16 of a-z, 0-9 and '-', starting with a letter
(VIA_RE); anything else is refused 400 bad_request."""

VIA_RE = r"[a-z][a-z0-9-]{0,15}"
"""The form of a VIA_HEADER value."""

API = "/v1"
"""Prefix of every versioned API path."""
