"""The binary layout of a segment file: blocks of events, each block checksummed as a whole.

A block is what one writer flush or one transaction commit appends to one segment: a 50-byte
header (magic `SLB1`, CRC-32, lengths, ingest time, event-time bounds, the writer's highest
event number), a meta field naming the writer or transaction, and the framed events. It is
valid as a whole or not at all, so a crash mid-write never exposes part of it (semantic 3), and
a transaction's events are contiguous by construction (semantic 5). The exact layout, byte by
byte, and how the CRC is chained: FORMAT.md ("Block layout").
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

BLOCK_MAGIC = b"SLB1"
EVENT_MAGIC = b"SE"
HEADER = struct.Struct("<4sIIIqqqQH")
EVENT = struct.Struct("<2sHI")
NO_TIME = -(2**63)
NO_KEY = 0xFFFF


@dataclass(frozen=True, slots=True)
class BlockHeader:
    offset: int
    body_len: int
    events: int
    ingest_ns: int
    t_min: int | None
    t_max: int | None
    last_event_number: int
    meta: bytes
    crc: int

    @property
    def body_offset(self) -> int:
        return self.offset + HEADER.size + len(self.meta)

    @property
    def end(self) -> int:
        return self.body_offset + self.body_len

    @property
    def length(self) -> int:
        return self.end - self.offset

    @property
    def writer_id(self) -> str | None:
        return self.meta[1:].decode() if self.meta[:1] == b"w" else None

    @property
    def txn_id(self) -> str | None:
        return self.meta[1:].decode() if self.meta[:1] == b"t" else None


def encode_event(payload: bytes, key: str | None) -> bytes:
    key_bytes = b"" if key is None else key.encode()
    key_len = NO_KEY if key is None else len(key_bytes)
    return EVENT.pack(EVENT_MAGIC, key_len, len(payload)) + key_bytes + payload


def encode_header(
    *,
    body_crc: int,
    body_len: int,
    events: int,
    ingest_ns: int,
    time_bounds: tuple[int, int] | None = None,
    last_event_number: int = 0,
    meta: bytes = b"",
) -> bytes:
    """Header and meta of a block whose body has CRC `body_crc`; the crc field is filled in."""
    t_min, t_max = time_bounds if time_bounds is not None else (NO_TIME, NO_TIME)
    fields = (body_len, events, ingest_ns, t_min, t_max, last_event_number, len(meta))
    unsigned = HEADER.pack(BLOCK_MAGIC, 0, *fields)
    crc = zlib.crc32(meta, zlib.crc32(unsigned[8:], body_crc))
    return HEADER.pack(BLOCK_MAGIC, crc, *fields) + meta


def parse_header(buf: bytes | memoryview, pos: int, file_offset: int) -> BlockHeader | None:
    """The header at `buf[pos:]`, or None if it is incomplete or not a block header."""
    if len(buf) - pos < HEADER.size:
        return None
    magic, crc, body_len, events, ingest_ns, t_min, t_max, last_en, meta_len = HEADER.unpack_from(
        buf, pos
    )
    if magic != BLOCK_MAGIC:
        return None
    meta_start = pos + HEADER.size
    if len(buf) - meta_start < meta_len:
        return None
    meta = bytes(buf[meta_start : meta_start + meta_len])
    return BlockHeader(
        offset=file_offset,
        body_len=body_len,
        events=events,
        ingest_ns=ingest_ns,
        t_min=None if t_min == NO_TIME else t_min,
        t_max=None if t_max == NO_TIME else t_max,
        last_event_number=last_en,
        meta=meta,
        crc=crc,
    )


def block_is_intact(
    header: BlockHeader, header_bytes: bytes | memoryview, body: bytes | memoryview
) -> bool:
    """True when `body` is complete and the block's CRC matches (nothing torn or overwritten)."""
    if len(body) != header.body_len:
        return False
    crc = zlib.crc32(header_bytes[8:], zlib.crc32(body))
    return crc == header.crc


def event_frame(buf: bytes | memoryview, pos: int) -> tuple[str | None, int, int]:
    """The key of the event frame at `buf[pos:]`, where its payload starts, and its length."""
    magic, key_len, payload_len = EVENT.unpack_from(buf, pos)
    if magic != EVENT_MAGIC:
        msg = f"corrupt event frame at {pos}"
        raise ValueError(msg)
    start = pos + EVENT.size
    if key_len == NO_KEY:
        return None, start, payload_len
    return bytes(buf[start : start + key_len]).decode(), start + key_len, payload_len


def iter_frames(body: bytes | memoryview) -> Iterator[tuple[str | None, bytes]]:
    """Yield `(key, frame)` for each event frame of a body, the frame as stored."""
    pos = 0
    while pos < len(body):
        key, payload_at, payload_len = event_frame(body, pos)
        end = payload_at + payload_len
        yield key, bytes(body[pos:end])
        pos = end


def iter_events(
    body: bytes | memoryview, header: BlockHeader
) -> Iterator[tuple[int, int, str | None, bytes]]:
    """Yield `(offset, end_offset, key, payload)` for each event of a block.

    The first event's offset is the block's own offset, and the last event's end is the block's
    end: reading from either boundary yields the same events.
    """
    pos, base, count = 0, header.body_offset, header.events
    for i in range(count):
        magic, key_len, payload_len = EVENT.unpack_from(body, pos)
        if magic != EVENT_MAGIC:
            msg = f"corrupt event at offset {base + pos} of block {header.offset}"
            raise ValueError(msg)
        start = pos + EVENT.size
        if key_len == NO_KEY:
            key, key_len = None, 0
        else:
            key = bytes(body[start : start + key_len]).decode()
        payload = bytes(body[start + key_len : start + key_len + payload_len])
        end = start + key_len + payload_len
        offset = header.offset if i == 0 else base + pos
        end_offset = header.end if i == count - 1 else base + end
        yield offset, end_offset, key, payload
        pos = end
