"""A Sluice `Retention` as a Pravega retention policy, and back.

Pravega keeps one retention policy per stream, by size or by time, and its controller applies
it on its own schedule. The Python client can set the policy but cannot read a stream's
configuration back; it can read the stream's *tags*. So the policy is also written as one tag
(`sluice.retention.max_bytes=N` or `sluice.retention.max_age_seconds=S`), from which `info()`
reports it. A stream created without Sluice has no such tag and reports no retention (its
policy may still exist on the server).
"""

from __future__ import annotations

from typing import Any

from pipeline.streams.errors import Unsupported
from pipeline.streams.values import Retention, check_retention

TAG_PREFIX = "sluice.retention."
_BACKEND = "Pravega"


def policy_for(client: Any, retention: Retention) -> tuple[Any, list[str]]:
    """(the client's StreamRetentionPolicy, the tags recording it) for `retention`."""
    size, age = retention.max_bytes, retention.max_age_seconds
    if size is not None and age is not None:
        raise Unsupported(
            _BACKEND,
            "retain by size and by age at once (a Pravega stream has one retention policy)",
            "choose max_bytes or max_age_seconds",
        )
    check_retention(retention)
    if size is not None:
        return client.StreamRetentionPolicy.by_size(size), [f"{TAG_PREFIX}max_bytes={size}"]
    if age is not None:
        millis = max(1, round(age * 1000))
        policy = client.StreamRetentionPolicy.by_time(millis)
        return policy, [f"{TAG_PREFIX}max_age_seconds={millis / 1000:g}"]
    return client.StreamRetentionPolicy.none(), []


def retention_from_tags(tags: list[str]) -> Retention:
    """The retention recorded in a stream's tags (none recorded: no retention known)."""
    for tag in tags:
        key, _, value = tag.removeprefix(TAG_PREFIX).partition("=")
        if not tag.startswith(TAG_PREFIX):
            continue
        if key == "max_bytes":
            return Retention(max_bytes=int(value))
        if key == "max_age_seconds":
            return Retention(max_age_seconds=float(value))
    return Retention()
