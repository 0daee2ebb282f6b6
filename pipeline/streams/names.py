"""Scope, stream and routing-key names.

Names become directory names in the embedded store, so they are checked before anything
touches the disk: nothing a user types can escape the store's directory.
"""

from __future__ import annotations

import re

from pipeline.streams.errors import InvalidName, InvalidRoutingKey

MAX_NAME = 255
MAX_ROUTING_KEY = 1024
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


def check_name(kind: str, name: str) -> str:
    """Return `name` if it is a valid scope or stream name, else raise `InvalidName`."""
    if not isinstance(name, str) or not name:
        raise InvalidName(kind, str(name), "it is empty")
    if len(name) > MAX_NAME:
        raise InvalidName(kind, name, f"it has {len(name)} characters, more than {MAX_NAME}")
    if not _NAME.fullmatch(name):
        raise InvalidName(kind, name, "it contains a character that is not allowed")
    return name


def parse_stream(qualified: str) -> tuple[str, str]:
    """Split `"scope/stream"` into its two checked parts."""
    parts = qualified.split("/") if isinstance(qualified, str) else []
    if len(parts) != 2:
        raise InvalidName(kind="stream", name=str(qualified), reason="expected SCOPE/STREAM")
    return check_name("scope", parts[0]), check_name("stream", parts[1])


def check_routing_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidRoutingKey(repr(key), "a routing key is a string")
    if len(key.encode()) > MAX_ROUTING_KEY:
        raise InvalidRoutingKey(key, f"longer than {MAX_ROUTING_KEY} bytes")
    return key
