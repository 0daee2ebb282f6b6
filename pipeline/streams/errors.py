"""Typed errors of the stream store.

Every error carries its context as fields and a message that says what to do next. All derive
from `StreamStoreError`, so a command line can print one clear line for any of them.
"""

from __future__ import annotations

import re

from pipeline.errors import SluiceError

#: The highest event number a writer may use (a signed 64-bit integer, as stored).
MAX_EVENT_NUMBER = 2**63 - 1


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
        msg = (
            f"stream {scope}/{stream} must be sealed before it is deleted"
            f" (`sluice store seal {scope}/{stream}`)"
        )
        super().__init__(msg)


class EventTooLarge(StreamStoreError, ValueError):
    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        msg = (
            f"event of {size:,} bytes is over the limit of {limit:,} bytes: split it into"
            " smaller ones"
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
    def __init__(self, text: str, cut_stream: str, stream: str) -> None:
        self.cut_stream, self.stream = cut_stream, stream
        super().__init__(text, f"it is a cut of stream {cut_stream}, not of {stream}")


class StaleCut(InvalidCut):
    """A cut that names another stream id than the stream of its name has now: most often a
    cut of an earlier stream of the same name, one deleted and created again since the cut
    was taken; or (rarely) a cut from another store, or one edited by hand. Its positions
    mean nothing in the stream there is now, so it is refused wherever it is used."""

    def __init__(
        self, text: str, stream: str, cut_stream_id: int, stream_id: int, earlier: str = ""
    ) -> None:
        self.stream, self.cut_stream_id, self.stream_id = stream, cut_stream_id, stream_id
        self.earlier = earlier
        named = f"stream id {cut_stream_id}{', ' + earlier if earlier else ''}"
        if cut_stream_id < stream_id:  # ids only grow: it may be the stream's earlier self
            reason = (
                f"it is a cut of an earlier stream named {stream} ({named}), not of the"
                f" {stream} there is now (stream id {stream_id}): a stream deleted and created"
                " again under its name starts anew, and this cut's positions mean nothing in"
                " it; take a cut of the new stream (head, tail, a reader group's) instead"
            )
        else:  # a newer id than the stream's: never one of its earlier selves
            reason = (
                f"it is a cut of another stream ({named}), not of {stream}, which is stream"
                f" id {stream_id}: its positions mean nothing in {stream}; take a cut of"
                f" {stream} (head, tail, a reader group's) instead"
            )
        super().__init__(text, reason)


class InvalidArgument(StreamStoreError, ValueError):
    """A value the store cannot use: a retention limit, a scaling policy, a split or a merge.

    Refused before anything is changed."""

    def __init__(self, name: str, value: object, rule: str) -> None:
        self.name, self.value, self.rule = name, value, rule
        msg = f"invalid {name} {value!r}: {rule}"
        super().__init__(msg)


class SegmentNotActive(StreamStoreError, LookupError):
    """A scale names a segment the stream does not have, or one sealed by an earlier scale."""

    def __init__(self, stream: str, segment: int, active: list[int]) -> None:
        self.stream, self.segment, self.active = stream, segment, active
        msg = (
            f"stream {stream} has no active segment {segment}: its active segments are"
            f" {', '.join(map(str, active))} (`sluice store info {stream}` lists them)"
        )
        super().__init__(msg)


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

    @classmethod
    def last_in(cls, text: str) -> Truncated | None:
        """The last `Truncated` a text reports by its message, as Spark's report of a failed
        query does (the Python worker's traceback, as text); None when there is none."""
        found = [*_TRUNCATED_MESSAGE.finditer(text)]
        if not found:
            return None
        m = found[-1]
        return cls(m["stream"], int(m["segment"]), int(m["offset"]), int(m["head"]))


#: `Truncated`'s message, qualified by its class as a traceback shows it.
_TRUNCATED_MESSAGE = re.compile(
    rf"{re.escape(__name__)}\.Truncated: stream (?P<stream>\S+) segment (?P<segment>\d+)"
    r" was truncated at offset (?P<head>\d+): position (?P<offset>\d+) "
)


class InvalidEventNumber(StreamStoreError, ValueError):
    """A writer's event number outside 1..2^63-1: refused, never dropped or wrapped."""

    def __init__(self, writer_id: str, number: int) -> None:
        self.writer_id, self.number = writer_id, number
        msg = (
            f"event number {number} of writer {writer_id!r} is out of range: event numbers"
            f" are whole numbers from 1 to {MAX_EVENT_NUMBER}, increasing per writer"
        )
        super().__init__(msg)


class Corrupted(StreamStoreError):
    """Stored data failed its check (a checksum, a frame, the index against the file).

    Nothing of the damaged block is returned; events before it were delivered.
    """

    def __init__(self, stream: str, segment: int, offset: int, problem: str) -> None:
        self.stream, self.segment, self.offset, self.problem = stream, segment, offset, problem
        super().__init__(self._message())

    def _message(self) -> str:
        return (
            f"stream {self.stream} segment {self.segment} is damaged at offset {self.offset}:"
            f" {self.problem}. Run `sluice store verify {self.stream}` to list the damage and"
            " `sluice store repair` to fix what can be fixed (and for what it cannot, the cut"
            " that reads on after it)"
        )


class SegmentDamaged(Corrupted):
    """A write to a segment that is marked damaged: refused until `repair` has run."""

    def _message(self) -> str:
        return (
            f"stream {self.stream} segment {self.segment} is damaged at offset {self.offset}"
            f" ({self.problem}), so it takes no writes: run `sluice store verify {self.stream}`"
            " to see the damage and `sluice store repair` to fix it; other segments and"
            " streams keep working"
        )


class StoreFull(StreamStoreError):
    """The disk (or a file size limit) is full: nothing of the failed write became visible."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        msg = (
            f"no space left to write {path} ({reason}): this write was not acknowledged and"
            " acknowledged data is intact; free some space (or truncate old data) and retry"
        )
        super().__init__(msg)


class CatalogUnusable(StreamStoreError):
    """The catalog cannot be used as it is; `repair` rebuilds it from the data files."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(self._message())

    def _message(self) -> str:
        return (
            f"the store catalog {self.path} cannot be used ({self.reason}): run"
            " `sluice store repair` to rebuild it from the data files"
        )


class CatalogDamaged(CatalogUnusable):
    """The catalog database cannot be read at all (not SQLite, or malformed)."""

    def _message(self) -> str:
        return (
            f"the store catalog {self.path} is damaged ({self.reason}): the segment files are"
            " untouched; run `sluice store repair` to set the damaged catalog aside and"
            " rebuild it from the data files"
        )


class CatalogMismatch(CatalogUnusable):
    """The catalog does not describe the data beside it: lost, emptied, replaced or old."""

    def _message(self) -> str:
        return (
            f"the store catalog {self.path} does not match the data beside it: {self.reason}."
            " Nothing was changed; run `sluice store repair` to rebuild the catalog from the"
            " data files"
        )


class StoreFormatTooNew(StreamStoreError):
    """A newer Sluice wrote the store, in a format this code does not know: refused before
    anything is written or cut (this code could take the newer data for damage)."""

    def __init__(self, path: str, found: str, supported: int) -> None:
        self.path, self.found, self.supported = path, found, supported
        msg = (
            f"{path} says the store has format {found}, newer than this Sluice knows (formats"
            f" up to {supported}): a newer Sluice wrote it. Nothing was changed; upgrade"
            " Sluice to open this store"
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


class ReaderGroupConflict(StreamStoreError, ValueError):
    """A reader group's name is taken by a group of another stream (or of a deleted stream of
    the same name: a group never continues into a new stream)."""

    def __init__(self, name: str, stream: str, reason: str) -> None:
        self.name, self.stream, self.reason = name, stream, reason
        msg = (
            f"reader group {name!r} cannot read {stream}: {reason}; delete the group"
            " (`delete_reader_group`) or choose another name"
        )
        super().__init__(msg)


class ReaderOffline(StreamStoreError):
    """A reader is no longer the one the group gives segments to: `reader_offline` named it,
    a reader with its id replaced it, or it read nothing for long enough to be presumed dead.
    The events it read but did not commit are read again by the segments' next owners."""

    def __init__(self, group: str, reader: str, reason: str) -> None:
        self.group, self.reader, self.reason = group, reader, reason
        msg = (
            f"reader {reader!r} of group {group!r} lost its segments: {reason} (the events"
            " it read from them since its last commit are read again by their new owners)"
        )
        super().__init__(msg)


class StoreUnavailable(StreamStoreError, ConnectionError):
    """The store cannot be reached (a Pravega controller down, a directory not writable)."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri, self.reason = uri, reason
        msg = f"stream store {uri} is unavailable: {reason}"
        super().__init__(msg)


class NoStore(StoreUnavailable):
    """An embedded store's directory does not exist: nothing was ever written there."""

    def __init__(self, uri: str, directory: str) -> None:
        self.directory = directory
        reason = f"no store at {directory}: nothing was ever written there (check --store)"
        super().__init__(uri, reason)


class Unsupported(StreamStoreError, NotImplementedError):
    """The backend cannot do this; the message names the nearest thing it can do."""

    def __init__(self, backend: str, feature: str, hint: str) -> None:
        self.backend, self.feature, self.hint = backend, feature, hint
        msg = f"{backend} cannot {feature}: {hint}"
        super().__init__(msg)
