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
_NAME_CHARACTER = re.compile(r"[A-Za-z0-9_.\-]")


def check_name(kind: str, name: str) -> str:
    """Return `name` if it is a valid scope or stream name, else raise `InvalidName`."""
    if not isinstance(name, str) or not name:
        raise InvalidName(kind, str(name), "it is empty")
    if len(name) > MAX_NAME:
        raise InvalidName(kind, name, f"it has {len(name)} characters, more than {MAX_NAME}")
    if not _NAME.fullmatch(name):
        raise InvalidName(kind, name, _broken_rule(name))
    return name


def _broken_rule(name: str) -> str:
    """Which rule of `_NAME` a name that does not match it breaks, in words."""
    if name[0] in ".-":
        return f"it starts with {name[0]!r}, which a name must not"
    bad = next(c for c in name if not _NAME_CHARACTER.fullmatch(c))
    return f"it contains {bad!r}, which is not allowed"


def parse_stream(qualified: str) -> tuple[str, str]:
    """Split `"scope/stream"` into its two checked parts."""
    parts = qualified.split("/") if isinstance(qualified, str) else []
    if len(parts) != 2:
        raise InvalidName(kind="stream", name=str(qualified), reason="expected SCOPE/STREAM")
    return check_name("scope", parts[0]), check_name("stream", parts[1])


def check_routing_key(key: str | None) -> str | None:
    """Return `key` if it can be a routing key (None: no key), else raise `InvalidRoutingKey`.

    A key is any text that is valid Unicode, at most `MAX_ROUTING_KEY` bytes in UTF-8; the
    empty text is a key (not the same as no key). Keys are compared as they are, code point
    by code point: no case folding, no Unicode normalisation, no trimming
    (`embedded/FORMAT.md`, "Routing keys")."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise InvalidRoutingKey(repr(key), "a routing key is a string")
    try:
        size = len(key.encode())
    except UnicodeEncodeError as exc:
        reason = (
            f"character {exc.start} is a lone surrogate ({key[exc.start]!r}), which is no "
            "Unicode text and cannot be stored as UTF-8 (was it read from bytes that are not "
            "UTF-8?): give the key as valid UTF-8 text"
        )
        raise InvalidRoutingKey(key, reason) from None
    if size > MAX_ROUTING_KEY:
        reason = (
            f"it is {size} bytes in UTF-8, longer than {MAX_ROUTING_KEY} bytes: use a shorter "
            "key (a sensor's name, or a hash of a longer one)"
        )
        raise InvalidRoutingKey(key, reason)
    return key
