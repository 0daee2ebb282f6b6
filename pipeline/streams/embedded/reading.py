"""Reading a segment's events: each block is checked whole before any of its events is returned.

Every block's header must agree with its index row, its CRC-32 must match and every event
frame must parse, or `BadBlock` is raised at that block, after the events of the blocks before
it were yielded. Blocks are read many at a time into a reused buffer, checksummed there (the
CRC-32 runs at tens of GB/s with zlib-ng) and their payloads copied out. A block holding one
large event (a collector flushing a 1000-sample event alone) has its payload read straight into
the bytes returned and its CRC chained over the pieces: one copy from the page cache.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import fields

from pipeline.streams.api import Event
from pipeline.streams.embedded.blocks import (
    EVENT,
    HEADER,
    MAX_META,
    BadBlock,
    BlockHeader,
    BlockRow,
    Frame,
    block_problem,
    frame_at,
    parse_frames,
    parse_header,
    row_problem,
)
from pipeline.streams.embedded.segment import SegmentFile

READ_CHUNK = 1 << 20
#: A block of one event longer than this is read straight into the event's bytes.
LARGE_EVENT = 16 << 10
MAX_KEY = 1024
#: Enough for a block header, the longest meta, and the first frame's header and longest key.
HEAD_READ = HEADER.size + MAX_META + EVENT.size + MAX_KEY

#: A checked block: its row, its body (a view into the reader's buffer, valid until the next
#: block is asked for, or the payload of a lone large event), and its frames in that body.
Checked = tuple[BlockRow, bytes | memoryview, list[Frame]]


class BlockReader:
    """Reads and checks blocks of one segment file, through a buffer reused from run to run."""

    def __init__(self, segfile: SegmentFile) -> None:
        self.segfile = segfile
        self._buffer = bytearray()

    def read(self, offset: int, size: int) -> memoryview:
        """`size` bytes at `offset` (fewer if the file ends first), valid until the next read."""
        if len(self._buffer) < size:
            self._buffer = bytearray(max(size, min(READ_CHUNK, 4 * len(self._buffer))))
        view = memoryview(self._buffer)[:size]
        return view[: os.preadv(self.segfile.fd, [view], offset)]

    def block(self, row: BlockRow) -> list[Frame]:
        """The frames of one block, checked whole."""
        return next(self.run([row]))[2]

    def run(self, rows: list[BlockRow]) -> Iterator[Checked]:
        """Each block of `rows` (contiguous), checked whole, read in as few reads as possible;
        damage raises at its block, after the blocks before it were delivered. Payloads are
        copied out of the buffer one by one as they are returned, each into a cache-warm
        place, rather than a block's worth at once."""
        i = 0
        while i < len(rows):
            if _large_event(rows[i]):
                yield self._large_event(rows[i])
                i += 1
                continue
            j, size = i, 0
            while j < len(rows) and not _large_event(rows[j]):
                if size and size + rows[j].length > READ_CHUNK:
                    break
                size += rows[j].length
                j += 1
            data, pos = self.read(rows[i].offset, size), 0
            for row in rows[i:j]:
                header, body = _checked(data, pos, row)
                yield row, body, parse_frames(body, header)
                pos += row.length
            i = j

    def _large_event(self, row: BlockRow) -> Checked:
        """The one event of a large block: header, frame and key read first, then the payload
        straight into the bytes returned; the CRC chained over the pieces."""
        head = memoryview(self.segfile.pread(min(row.length, HEAD_READ), row.offset))
        header = _header(head, 0, row)
        frame = header.body_offset - row.offset
        key, payload_at, payload_len = frame_at(head, frame, row.offset)
        if payload_at + payload_len != row.length:
            raise BadBlock(row.offset + frame, "the event does not fill its block")
        payload = self.segfile.pread(payload_len, row.offset + payload_at)
        body_crc = header.checksum(payload, header.checksum(head[frame:payload_at]))
        body_len = payload_at - frame + len(payload)
        problem = block_problem(header, head[:frame], body_len, body_crc)
        if problem is not None:
            raise BadBlock(row.offset, problem)
        return row, payload, [(row.offset, row.end, key, 0, len(payload))]


def _large_event(row: BlockRow) -> bool:
    """One event filling a large block: read straight into its bytes, not through a buffer."""
    return row.events == 1 and row.length > LARGE_EVENT


def _checked(data: memoryview, pos: int, row: BlockRow) -> tuple[BlockHeader, memoryview]:
    """The header and body of the block `row` at `data[pos:]`, its checksum verified."""
    header = _header(data, pos, row)
    body_at = pos + header.body_offset - row.offset
    body = data[body_at : pos + row.length]
    problem = block_problem(header, data[pos:body_at], len(body), header.checksum(body))
    if problem is not None:
        raise BadBlock(row.offset, problem)
    return header, body


def _header(data: memoryview, pos: int, row: BlockRow) -> BlockHeader:
    header = parse_header(data, pos, row.offset)
    if header is None and len(data) - pos < HEADER.size:
        raise BadBlock(row.offset, "the segment file ends before this block's header")
    problem = row_problem(header, row)
    if problem is not None:
        raise BadBlock(row.offset, problem)
    assert header is not None
    return header


def _event_maker() -> Callable[..., Event]:
    """`Event(...)` without its dataclass `__init__`, which sets each field of a frozen class
    through `object.__setattr__`: the same object (same slots, equal, picklable) in half the
    time, which is a tenth of a read of 64 KiB events. Event has no `__post_init__`."""
    setters = [Event.__dict__[f.name].__set__ for f in fields(Event)]
    assert len(setters) == 7, "update the unrolled setters below with Event's fields"
    s1, s2, s3, s4, s5, s6, s7 = setters
    new = object.__new__

    def make(  # noqa: PLR0917 - Event's fields, positionally, as `Event(...)` takes them
        stream: str, segment: int, offset: int, end: int, key: str | None, payload: bytes, ns: int
    ) -> Event:
        event = new(Event)
        s1(event, stream)
        s2(event, segment)
        s3(event, offset)
        s4(event, end)
        s5(event, key)
        s6(event, payload)
        s7(event, ns)
        return event

    return make


_event = _event_maker()


def read_events(
    reader: BlockReader, stream: str, segment: int, rows: list[BlockRow], *, start: int, end: int
) -> Iterator[Event]:
    """Events in [start, end) of `rows`, the index rows that cover that range, in order.

    A gap in the rows (before the first, between two, after the last) is damage too: the index
    covers a segment's data without holes.
    """
    expected, i = (min(start, rows[0].offset) if rows else start), 0
    while True:
        j = i
        while j < len(rows) and rows[j].offset == expected:
            expected = rows[j].end
            j += 1
        for row, body, frames in reader.run(rows[i:j]):
            for off, end_off, key, at, until in frames:
                if start <= off and end_off <= end:  # (a whole bytes object is not copied)
                    payload = bytes(body[at:until])
                    yield _event(stream, segment, off, end_off, key, payload, row.ingest_ns)
        if j < len(rows):
            msg = f"the index has no block here (the next one starts at {rows[j].offset})"
            raise BadBlock(expected, msg)
        if expected < end:
            raise BadBlock(expected, "the index has no block here (nor after)")
        return
