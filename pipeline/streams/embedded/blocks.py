"""The binary layout of a segment file: blocks of events, each block checksummed as a whole.

A block is what one writer flush or one transaction commit appends to one segment: a 50-byte
header (magic `SLB2` and a CRC-32C, or in version-1 blocks `SLB1` and a CRC-32; lengths,
ingest time, event-time bounds, the writer's highest event number), a meta field naming the
writer or transaction, and the framed events. It is
valid as a whole or not at all, so a crash mid-write never exposes part of it (semantic 3), and
a transaction's events are contiguous by construction (semantic 5). The exact layout, byte by
byte, and how the CRC is chained: FORMAT.md ("Block layout").
"""

from __future__ import annotations

import functools
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

try:  # the same CRC-32 as zlib's, 5-10x faster (PCLMULQDQ / VPCLMULQDQ / ARMv8 CRC)
    from zlib_ng.zlib_ng import crc32
except ImportError:  # pragma: no cover - the edge extra installs zlib-ng; zlib gives equal sums
    from zlib import crc32

try:  # CRC-32C with the SSE4.2 / ARMv8 CRC instructions
    from crc32c import crc32c
except ImportError:  # pragma: no cover - the edge extra installs crc32c
    crc32c = None

Checksum = Callable[..., int]

#: Block magics by format: version 1 blocks carry a CRC-32, version 2 blocks a CRC-32C.
BLOCK_MAGIC_V1 = b"SLB1"
BLOCK_MAGIC_V2 = b"SLB2"
#: Version 1 is written only where its CRC-32 is at least this much faster than CRC-32C.
CLEARLY_FASTER = 1.25


def faster_version(sample_bytes: int = 1 << 18, rounds: int = 5) -> bytes:
    """The magic of the block version whose checksum this CPU computes faster: version 2
    (CRC-32C) unless version 1's CRC-32 is `CLEARLY_FASTER` (or the crc32c package is missing).

    Neither is fastest everywhere. zlib-ng folds its CRC-32 with VPCLMULQDQ where the CPU has
    AVX-512 (about 100 GB/s on the Xeon we measure, 4x the crc32c package's CRC-32C), and with
    PCLMULQDQ elsewhere (the AMD EPYC we measure computes CRC-32C 1.6x faster). A verified read
    computes the checksum of every byte it returns, so the writer picks the one this machine
    reads faster, measured once per process (best of `rounds`, under 1 ms): blocks carry
    their version and every reader checks both, so the choice is the writer's alone.
    """
    if crc32c is None:
        return BLOCK_MAGIC_V1
    sample, best = bytes(sample_bytes), {}
    for _ in range(rounds):
        for name, function in (("crc32", crc32), ("crc32c", crc32c)):
            start = time.perf_counter()
            function(sample)
            elapsed = time.perf_counter() - start
            best[name] = min(best.get(name, elapsed), elapsed)
    return BLOCK_MAGIC_V1 if best["crc32"] * CLEARLY_FASTER < best["crc32c"] else BLOCK_MAGIC_V2


#: The magic of the blocks this process writes (`faster_version`).
BLOCK_MAGIC = faster_version()
BLOCK_MAGICS = (BLOCK_MAGIC_V1, BLOCK_MAGIC_V2)
#: What every block magic starts with (a scan for blocks past damage looks for it).
MAGIC_PREFIX = b"SLB"
#: A transaction body's recorded checksum is a CRC-32C plus this flag, or, for a body first
#: flushed by a process that wrote version-1 blocks, a bare CRC-32 (see `body_checksum`).
BODY_CRC32C = 1 << 32
EVENT_MAGIC = b"SE"
HEADER = struct.Struct("<4sIIIqqqQH")
EVENT = struct.Struct("<2sHI")
NO_TIME = -(2**63)
NO_KEY = 0xFFFF
#: The longest meta field: "w" + a writer id of at most 255 characters (UTF-8).
MAX_META = 1 + 4 * 255


class ChecksumUnavailable(RuntimeError):
    """A version-2 block (CRC-32C) met without the crc32c package: install the edge extra."""

    def __init__(self) -> None:
        msg = "this store has CRC-32C blocks: install the crc32c package (pip install crc32c)"
        super().__init__(msg)

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return type(self), ()


def checksum_for(magic: bytes) -> Checksum:
    """The checksum function of blocks with this magic: CRC-32 (version 1) or CRC-32C."""
    if magic == BLOCK_MAGIC_V1:
        return crc32
    if crc32c is None:
        raise ChecksumUnavailable
    return crc32c


def body_magic(recorded: int, body_len: int) -> bytes:
    """The block version a transaction body's recorded checksum belongs to: a body first
    flushed by a process that wrote version-1 blocks has a bare CRC-32 and lands as one; an
    empty one takes the version this process writes."""
    if body_len and recorded < BODY_CRC32C:
        return BLOCK_MAGIC_V1
    return BLOCK_MAGIC if body_len == 0 else BLOCK_MAGIC_V2


def body_checksum(recorded: int, body_len: int, data: bytes | memoryview) -> int:
    """The recorded checksum of a transaction body of `body_len` bytes, `data` appended."""
    magic = body_magic(recorded, body_len)
    found = checksum_for(magic)(data, recorded & 0xFFFFFFFF)
    return found | BODY_CRC32C if magic == BLOCK_MAGIC_V2 else found


class BadBlock(Exception):
    """A block that fails its checks: the file offset of the damage and what is wrong.

    Internal to the embedded store, which turns it into `Corrupted` with the stream's name.
    """

    def __init__(self, offset: int, problem: str) -> None:
        super().__init__(offset, problem)
        self.offset, self.problem = offset, problem


@dataclass(frozen=True, slots=True)
class BlockRow:
    """One block of the index: where it lies in its segment, its events and times."""

    offset: int
    length: int
    events: int
    ingest_ns: int
    t_min: int | None
    t_max: int | None

    @property
    def end(self) -> int:
        return self.offset + self.length


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
    magic: bytes

    @property
    def checksum(self) -> Checksum:
        return checksum_for(self.magic)

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
    return frame_head(len(payload), key) + payload


def frame_head(payload_len: int, key: str | None) -> bytes:
    """An event frame up to its payload: magic, lengths and the routing key."""
    key_bytes = b"" if key is None else key.encode()
    key_len = NO_KEY if key is None else len(key_bytes)
    return EVENT.pack(EVENT_MAGIC, key_len, payload_len) + key_bytes


def encode_header(
    *,
    body_crc: int,
    body_len: int,
    events: int,
    ingest_ns: int,
    time_bounds: tuple[int, int] | None = None,
    last_event_number: int = 0,
    meta: bytes = b"",
    magic: bytes | None = None,
) -> bytes:
    """Header and meta of a block whose body has checksum `body_crc` (CRC-32C, or CRC-32 for
    a version-1 `magic`; `magic` is that of the blocks this process writes unless given);
    the crc field is filled in."""
    magic = magic or BLOCK_MAGIC
    t_min, t_max = time_bounds if time_bounds is not None else (NO_TIME, NO_TIME)
    fields = (body_len, events, ingest_ns, t_min, t_max, last_event_number, len(meta))
    unsigned = HEADER.pack(magic, 0, *fields)
    sums = checksum_for(magic)
    crc = sums(meta, sums(unsigned[8:], body_crc & 0xFFFFFFFF))
    return HEADER.pack(magic, crc, *fields) + meta


def parse_header(buf: bytes | memoryview, pos: int, file_offset: int) -> BlockHeader | None:
    """The header at `buf[pos:]`, or None if it is incomplete or not a block header."""
    if len(buf) - pos < HEADER.size:
        return None
    magic, crc, body_len, events, ingest_ns, t_min, t_max, last_en, meta_len = HEADER.unpack_from(
        buf, pos
    )
    if magic not in BLOCK_MAGICS:
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
        magic=magic,
    )


def block_problem(
    header: BlockHeader, header_bytes: bytes | memoryview, body_len: int, body_crc: int
) -> str | None:
    """What is wrong with a block whose header parsed, given the length and checksum (the
    header's: `header.checksum`) of the body found after it; None when it is whole and its
    checksum matches."""
    if body_len != header.body_len:
        return f"the block is cut short: {body_len} of its {header.body_len} body bytes"
    found = header.checksum(header_bytes[8:], body_crc)
    if found != header.crc:
        return f"checksum mismatch (stored {header.crc:08x}, computed {found:08x})"
    return None


def block_is_intact(
    header: BlockHeader, header_bytes: bytes | memoryview, body: bytes | memoryview
) -> bool:
    """True when `body` is complete and the block's checksum matches (nothing torn or
    overwritten)."""
    return block_problem(header, header_bytes, len(body), header.checksum(body)) is None


def row_problem(header: BlockHeader | None, row: BlockRow) -> str | None:
    """What is wrong when a block header disagrees with its index row (or is not a header)."""
    if header is None:
        return "no block header where the index has a block"
    if header.length != row.length or header.events != row.events:
        return (
            f"the block header ({header.length} bytes, {header.events} events) disagrees with"
            f" the index ({row.length} bytes, {row.events} events)"
        )
    return None


#: An event's place in a block: offset, end offset, routing key, and where its payload starts
#: and ends in the block's body.
Frame = tuple[int, int, str | None, int, int]


def parse_frames(body: bytes | memoryview, header: BlockHeader) -> list[Frame]:
    """Where every event of a block whose CRC matched lies, each frame checked.

    Every frame is checked (magic, lengths inside the body, the event count, nothing left
    over), so a damaged block raises `BadBlock` before any of its events is returned; the
    payloads are not copied yet. The first event's offset is the block's own offset and the
    last event's end is the block's end: reading from either boundary yields the same events.
    """
    equal = _equal_frames(body, header)
    if equal is not None:
        return equal
    pos, base, count, size = 0, header.body_offset, header.events, len(body)
    unpack, fixed = EVENT.unpack_from, EVENT.size  # `frame_at`, unrolled: this runs per event
    frames: list[Frame] = []
    keys: dict[bytes, str] = {}  # each key decoded once: a block's events share a few
    for i in range(count):
        if pos + fixed > size:
            raise BadBlock(base + pos, "an event frame is cut short")
        magic, key_len, payload_len = unpack(body, pos)
        if magic != EVENT_MAGIC:
            raise BadBlock(base + pos, "an event frame has no magic")
        at, key = pos + fixed, None
        if key_len != NO_KEY:
            if at + key_len > size:
                raise BadBlock(base + pos, "a routing key runs past its block")
            raw = bytes(body[at : at + key_len])
            key = keys.get(raw)
            if key is None:
                try:
                    key = keys[raw] = raw.decode()
                except UnicodeDecodeError:
                    raise BadBlock(base + pos, "a routing key is not UTF-8") from None
            at += key_len
        end = at + payload_len
        if end > size:
            raise BadBlock(base + pos, f"event {i + 1} of {count} runs past its block")
        offset = header.offset if i == 0 else base + pos
        end_offset = header.end if i == count - 1 else base + end
        frames.append((offset, end_offset, key, at, end))
        pos = end
    if pos != size:
        raise BadBlock(base + pos, f"{size - pos} bytes follow the last of {count} events")
    return frames


def _equal_frames(body: bytes | memoryview, header: BlockHeader) -> list[Frame] | None:
    """The frames of a block whose events all have one payload length and one routing key (a
    flush of fixed-size samples under one key), every frame head checked at once: the body
    must be that frame `events` times over, each head equal to the first. None when it is not
    (`parse_frames` then walks the frames and says what is wrong, if anything is)."""
    count, size = header.events, len(body)
    if count < 2 or size < EVENT.size:
        return None
    magic, key_len, payload_len = EVENT.unpack_from(body, 0)
    head_len = EVENT.size + (0 if key_len == NO_KEY else key_len)
    step = head_len + payload_len
    if magic != EVENT_MAGIC or step * count != size:
        return None
    heads = list(_frame_struct(head_len, payload_len).iter_unpack(body))
    if heads.count(heads[0]) != count:
        return None
    try:
        key = None if key_len == NO_KEY else heads[0][0][EVENT.size :].decode()
    except UnicodeDecodeError:
        return None
    base = header.body_offset
    frames = [
        (base + at, base + at + step, key, at + head_len, at + step) for at in range(0, size, step)
    ]
    frames[0] = (header.offset, *frames[0][1:])  # the first event starts where its block does
    return frames


@functools.lru_cache(maxsize=64)
def _frame_struct(head_len: int, payload_len: int) -> struct.Struct:
    """One frame: its head (magic, lengths, key) as bytes, its payload skipped."""
    return struct.Struct(f"{head_len}s{payload_len}x")


def frame_at(buf: bytes | memoryview, pos: int, base: int = 0) -> tuple[str | None, int, int]:
    """The key of the event frame at `buf[pos:]`, where its payload starts, and its length;
    `BadBlock` (at file offset `base + pos`) if it is not a whole frame header and key."""
    if pos + EVENT.size > len(buf):
        raise BadBlock(base + pos, "an event frame is cut short")
    magic, key_len, payload_len = EVENT.unpack_from(buf, pos)
    if magic != EVENT_MAGIC:
        raise BadBlock(base + pos, "an event frame has no magic")
    start = pos + EVENT.size
    if key_len == NO_KEY:
        return None, start, payload_len
    if start + key_len > len(buf):
        raise BadBlock(base + pos, "a routing key runs past its block")
    try:
        key = bytes(buf[start : start + key_len]).decode()
    except UnicodeDecodeError:
        raise BadBlock(base + pos, "a routing key is not UTF-8") from None
    return key, start + key_len, payload_len


def iter_frames(body: bytes | memoryview) -> Iterator[tuple[str | None, bytes]]:
    """Yield `(key, frame)` for each event frame of a body, the frame as stored."""
    pos = 0
    while pos < len(body):
        key, payload_at, payload_len = frame_at(body, pos)
        end = payload_at + payload_len
        yield key, bytes(body[pos:end])
        pos = end
