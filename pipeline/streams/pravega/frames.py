"""Exact, offset-bounded reads of one Pravega segment, event by event.

The client cannot read "segment S from offset A to offset B", but its `ByteStream` is a seekable
byte view of a stream's single segment. Pravega frames each event with an 8-byte header (type
code 0 = EVENT, payload length) as its Java and Rust readers parse it, so this module reads
exactly [start, end) by parsing frames from `start`, and refuses a position that is not an event
boundary (the frames must chain exactly onto `end`). Offsets are positions of Pravega's own
stream cuts. Why and how: ADAPTER.md ("Exact reads").
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.streams.errors import InvalidCut
from pipeline.streams.values import MAX_EVENT_SIZE, Event

HEADER = struct.Struct(">ii")
EVENT_TYPE = 0
READ_CHUNK = 1 << 20


class SegmentBytes:
    """A stream's only segment, as bytes at absolute offsets (a `pravega_client.ByteStream`).

    `call` runs each client call through the store's error guard.
    """

    def __init__(self, byte_stream: Any, call: Callable[[str, Callable[[], Any]], Any]) -> None:
        self._bs = byte_stream
        self._call = call

    def head(self) -> int:
        return int(self._call("read the head offset", self._bs.current_head_offset))

    def tail(self) -> int:
        return int(self._call("read the tail offset", self._bs.current_tail_offset))

    def read(self, offset: int, length: int) -> bytes:
        """Exactly `length` bytes from `offset` (the caller keeps within [head, tail])."""
        buf = bytearray(length)
        view = memoryview(buf)
        self._call("seek", lambda: self._bs.seek(offset, 0))
        got = 0
        while got < length:
            rest = view[got:]
            n = int(self._call("read", lambda rest=rest: self._bs.readinto(rest)))
            if n <= 0:
                msg = f"the segment ended at {offset + got}, before {offset + length}"
                raise InvalidCut(str(offset + length), msg)
            got += n
        return bytes(buf)


def frame_length(header: bytes, offset: int) -> int:
    """The payload length of the frame whose header is `header`, or `InvalidCut`."""
    kind, length = HEADER.unpack(header)
    if kind != EVENT_TYPE or not 0 <= length <= MAX_EVENT_SIZE:
        msg = f"offset {offset} is not an event boundary (found type {kind}, length {length})"
        raise InvalidCut(str(offset), msg)
    return length


def iter_frames(
    source: SegmentBytes, stream: str, segment: int, start: int, end: int
) -> Iterator[Event]:
    """The events whose frames lie in [start, end); both must be event boundaries."""
    buffer, base = b"", start  # buffer holds the bytes [base, base + len(buffer))
    pos = start
    while pos < end:
        if pos + HEADER.size > end:
            raise _not_boundary(end, pos)
        buffer, base = _ensure(source, buffer, base, pos=pos, need=HEADER.size, end=end)
        length = frame_length(buffer[pos - base : pos - base + HEADER.size], pos)
        stop = pos + HEADER.size + length
        if stop > end:
            raise _not_boundary(end, pos)
        buffer, base = _ensure(source, buffer, base, pos=pos, need=stop - pos, end=end)
        payload = buffer[pos - base + HEADER.size : stop - base]
        yield Event(stream, segment, pos, stop, None, payload, 0)
        pos = stop


def count_frames(source: SegmentBytes, start: int, end: int) -> int:
    """How many events lie in [start, end), reading only their headers."""
    count, pos = 0, start
    while pos < end:
        if pos + HEADER.size > end:
            raise _not_boundary(end, pos)
        pos += HEADER.size + frame_length(source.read(pos, HEADER.size), pos)
        count += 1
    if pos != end:
        raise _not_boundary(end, pos)
    return count


def check_boundary(source: SegmentBytes, offset: int, tail: int) -> None:
    """Refuse `offset` unless it is the tail or a frame that chains onto the tail."""
    count_frames(source, offset, tail)


def _ensure(
    source: SegmentBytes, buffer: bytes, base: int, *, pos: int, need: int, end: int
) -> tuple[bytes, int]:
    """`buffer` extended so that it holds [pos, pos + need), reading ahead up to READ_CHUNK."""
    have_until = base + len(buffer)
    if pos >= base and pos + need <= have_until:
        return buffer, base
    keep = buffer[pos - base :] if base <= pos < have_until else b""
    read_from = pos + len(keep)
    length = min(end, max(pos + need, pos + READ_CHUNK)) - read_from
    return keep + source.read(read_from, length), pos


def _not_boundary(end: int, pos: int) -> InvalidCut:
    msg = f"offset {end} is not an event boundary (an event starts at {pos} and runs past it)"
    return InvalidCut(str(end), msg)
