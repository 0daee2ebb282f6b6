"""Typed errors of the stream store.

Every error carries its context as fields and a message that says what to do next. All derive
from `StreamStoreError`, so a command line can print one clear line for any of them.
"""

from __future__ import annotations

from pipeline.errors import SluiceError


class StreamStoreError(SluiceError):
    """Base class of every error the stream store raises on purpose."""


class InvalidName(StreamStoreError, ValueError):
    def __init__(self, kind: str, name: str, reason: str) -> None:
        self.kind, self.name, self.reason = kind, name, reason
        msg = (
            f"invalid {kind} name {name!r}: {reason} "
            "(use 1-255 ASCII letters, digits, '-', '_' or '.', not starting with '.' or '-')"
        )
        super().__init__(msg)


class ScopeNotFound(StreamStoreError, LookupError):
    def __init__(self, scope: str) -> None:
        self.scope = scope
        msg = f"scope {scope!r} does not exist: create it with `sluice store create {scope}/STREAM`"
        super().__init__(msg)


class StreamNotFound(StreamStoreError, LookupError):
    def __init__(self, scope: str, stream: str) -> None:
        self.scope, self.stream = scope, stream
        msg = (
            f"stream {scope}/{stream} does not exist: "
            f"create it with `sluice store create {scope}/{stream}` or check `sluice store list`"
        )
        super().__init__(msg)


class StreamSealed(StreamStoreError):
    def __init__(self, scope: str, stream: str) -> None:
        self.scope, self.stream = scope, stream
        msg = f"stream {scope}/{stream} is sealed: it accepts no more writes"
        super().__init__(msg)


class StreamNotSealed(StreamStoreError):
    def __init__(self, scope: str, stream: str) -> None:
        self.scope, self.stream = scope, stream
        msg = f"stream {scope}/{stream} must be sealed before it is deleted"
        super().__init__(msg)


class EventTooLarge(StreamStoreError, ValueError):
    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        msg = (
            f"event of {size} bytes is over the limit of {limit} bytes: split it into smaller ones"
        )
        super().__init__(msg)


class InvalidRoutingKey(StreamStoreError, ValueError):
    def __init__(self, key: str, reason: str) -> None:
        self.key, self.reason = key, reason
        msg = f"invalid routing key {key[:80]!r}: {reason}"
        super().__init__(msg)


class InvalidCut(StreamStoreError, ValueError):
    """A stream cut that cannot be parsed or does not fit the stream it is used with."""

    def __init__(self, text: str, reason: str) -> None:
        self.text, self.reason = text, reason
        msg = f"invalid stream cut {text[:200]!r}: {reason}"
        super().__init__(msg)


class CutStreamMismatch(InvalidCut):
    def __init__(self, cut_stream: str, stream: str) -> None:
        self.cut_stream, self.stream = cut_stream, stream
        super().__init__(cut_stream, f"it is a cut of stream {cut_stream}, not of {stream}")


class Truncated(StreamStoreError):
    """A read asked for data before a segment's truncation point: that data is gone."""

    def __init__(self, stream: str, segment: int, offset: int, truncated_at: int) -> None:
        self.stream, self.segment = stream, segment
        self.offset, self.truncated_at = offset, truncated_at
        msg = (
            f"stream {stream} segment {segment} was truncated at offset {truncated_at}: "
            f"position {offset} is no longer readable; start from the head cut instead"
        )
        super().__init__(msg)


class TxnNotFound(StreamStoreError, LookupError):
    def __init__(self, txn_id: str) -> None:
        self.txn_id = txn_id
        msg = f"transaction {txn_id} is unknown to this store (never begun here, or already purged)"
        super().__init__(msg)


class TxnFailed(StreamStoreError):
    """A transaction cannot be committed: it was aborted or its lease expired."""

    def __init__(self, txn_id: str, state: str, reason: str) -> None:
        self.txn_id, self.state, self.reason = txn_id, state, reason
        msg = f"transaction {txn_id} cannot be committed: {reason}"
        super().__init__(msg)


class ReaderGroupNotFound(StreamStoreError, LookupError):
    def __init__(self, name: str) -> None:
        self.name = name
        msg = f"reader group {name!r} does not exist"
        super().__init__(msg)


class StoreUnavailable(StreamStoreError, ConnectionError):
    """The store cannot be reached (a Pravega controller down, a directory not writable)."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri, self.reason = uri, reason
        msg = f"stream store {uri} is unavailable: {reason}"
        super().__init__(msg)


class Unsupported(StreamStoreError, NotImplementedError):
    """The backend cannot do this; the message names the nearest thing it can do."""

    def __init__(self, backend: str, feature: str, hint: str) -> None:
        self.backend, self.feature, self.hint = backend, feature, hint
        msg = f"{backend} cannot {feature}: {hint}"
        super().__init__(msg)
