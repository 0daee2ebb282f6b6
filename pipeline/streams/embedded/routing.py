"""Routing: which segment of a stream an event goes to.

A routing key hashes to a fixed position in the key space [0, 1), the same in every process and
run; each active segment owns a range of that space, so all events with one key go to one
segment and keep their order (semantic 1). An event without a key goes to any active segment.
"""

from __future__ import annotations

import hashlib
import random

#: An active segment and the key range it owns: (segment, key_lo, key_hi).
SegmentRange = tuple[int, float, float]


def key_position(key: str) -> float:
    """Where a routing key falls in the key space [0, 1): stable across processes and runs."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def route(active: list[SegmentRange], key: str | None) -> int:
    """The segment among `active` whose range holds `key` (a random one when there is no key)."""
    if key is None:
        return random.choice(active)[0]
    pos = key_position(key)
    for seg, lo, hi in active:
        if lo <= pos < hi:
            return seg
    return active[-1][0]
