"""The shared language of rc: model records, wire records, codecs, HTTP client.

Standard library only: this package ships in dist/rc.pyz (docs/design.md#layering).
"""

INSTANCE_HEADER = "Rc-Controller-Instance"
"""Header on every response: a random id for this controller process.

Defined here rather than in rc.proto.wire so that the HTTP client (and so every
CLI command) does not pay for importing the wire records it never uses."""

API = "/v1"
"""Prefix of every versioned API path."""
