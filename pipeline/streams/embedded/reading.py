"""Reading a segment's events: each block is checked whole before any of its events is returned.

Every block's header must agree with its index row, its checksum must match and every event
frame must parse, or `BadBlock` is raised at that block, after the events of the blocks before
it were delivered. A range is read in runs of contiguous blocks (up to `RUN_BYTES`), each run
with one `pread` into a bytes object of its own and checked there; a block holding one large
event has its payload read straight into the bytes returned and its checksum chained over the
pieces. Runs are delivered in order, and a damaged block stops the read after the blocks
before it. `read_events` copies each payload into its own bytes;
`read_batches` copies nothing: a batch's payloads are slices of its run's bytes.
"""

from __future__ import annotations

import bisect
import mmap
import operator
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields

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
from pipeline.streams.values import Event, EventBatch

#: The most bytes of contiguous blocks read and checked at once (a larger block is read alone).
RUN_BYTES = 1 << 20
#: A block of one event longer than this is read straight into the event's bytes.
LARGE_EVENT = 16 << 10
MAX_KEY = 1024
#: Enough for a block header, the longest meta, and the first frame's header and longest key.
HEAD_READ = HEADER.size + MAX_META + EVENT.size + MAX_KEY

#: A lone large event's block checked: its row, its payload, and its one frame.
Checked = tuple[BlockRow, bytes, list[Frame]]


class BlockReader:
    """Reads and checks blocks of one segment file, through run buffers reused from run to run
    (`Buffers`) and the frames of large blocks parsed before (`ParsedFrames`), both shared by
    the reads of one store."""

    def __init__(
        self,
        segfile: SegmentFile,
        buffers: Buffers | None = None,
        parsed: ParsedFrames | None = None,
    ) -> None:
        self.segfile = segfile
        self.buffers = buffers if buffers is not None else Buffers()
        self.parsed = parsed

    def frames(self, header: BlockHeader, body: memoryview) -> list[Frame]:
        """The frames of a block whose checksum this read has just verified."""
        if self.parsed is None:
            return parse_frames(body, header)
        return self.parsed.frames(self.segfile, header, body)

    def block(self, row: BlockRow) -> list[Frame]:
        """The frames of one block, checked whole (`BadBlock` if it is damaged)."""
        checked = check_run(self, [row])
        if checked.damage is not None:
            raise checked.damage
        return checked.blocks[0][2]

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


class Buffers:
    """Run buffers reused from run to run: one is handed out again only once nothing refers to
    it any more (no batch, payload view or run holds it), so a batch's payloads stay valid as
    long as it is kept, and a reader that lets each batch go reads into warm memory.

    The buffers are anonymous maps, so they start on a page boundary: on the x86-64 machines we
    measure, the kernel copies from a cache-line-aligned file offset into a destination 16 bytes
    past a cache line (where a large `bytearray`'s data lies) at a third of the speed.
    """

    KEEP = 8
    #: References to a buffer no one else holds: the list, the loop variable, getrefcount's.
    _IDLE = 3

    def __init__(self) -> None:
        self._all: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def get(self, size: int) -> mmap.mmap:
        with self._lock:
            for buf in self._all:
                if sys.getrefcount(buf) == self._IDLE and len(buf) >= size:
                    return buf
            buf = mmap.mmap(-1, max(size, RUN_BYTES))
            if len(self._all) < self.KEEP:
                self._all.append(buf)
            return buf


class ParsedFrames:
    """The frames of recently read large blocks, so that reading a few events of a block of
    thousands (a slice's count, a cut's boundary check, a reader group's next poll) does not
    parse every frame of it again each time.

    An entry is keyed by the segment file, the block's offset and its stored checksum, and is
    used only after this read has verified the block's checksum over the bytes it just read:
    the frames are a function of those bytes, so a block that changed since (damaged, or a
    new block written at that offset after a repair) never meets the frames of the old one.
    Small blocks are parsed again (it costs less than keeping them); at most `MAX_FRAMES`
    frames are kept, the least recently used block leaving first."""

    MIN_EVENTS = 64
    MAX_FRAMES = 1 << 18

    def __init__(self) -> None:
        self._blocks: OrderedDict[tuple[str, int, int, int], list[Frame]] = OrderedDict()
        self._kept = 0
        self._lock = threading.Lock()

    def frames(self, segfile: SegmentFile, header: BlockHeader, body: memoryview) -> list[Frame]:
        if header.events < self.MIN_EVENTS:
            return parse_frames(body, header)
        key = (str(segfile.path), header.offset, header.crc, header.body_len)
        with self._lock:
            found = self._blocks.get(key)
            if found is not None:
                self._blocks.move_to_end(key)
                return found
        frames = parse_frames(body, header)
        with self._lock:
            if key not in self._blocks:
                self._blocks[key] = frames
                self._kept += len(frames)
            while self._kept > self.MAX_FRAMES and len(self._blocks) > 1:
                _, dropped = self._blocks.popitem(last=False)
                self._kept -= len(dropped)
        return frames


@dataclass(slots=True)
class CheckedRun:
    """Contiguous blocks read with one `pread` and checked: `data` holds them (a read-only view
    of a run buffer) or, for a lone large event, is its payload (bytes); each block comes with
    where its body starts in `data` and its frames (payload positions relative to the body).
    `damage` is the first block that failed, after the blocks that passed. Whoever consumes a
    run lets go of `data` (`release`) so that its buffer can be reused for the next one."""

    data: memoryview | bytes
    blocks: list[tuple[BlockRow, int, list[Frame]]]
    damage: BadBlock | None

    def release(self) -> None:
        self.data, self.blocks = b"", []


def plan_runs(rows: list[BlockRow]) -> list[list[BlockRow]]:
    """`rows` cut into runs of at most `RUN_BYTES` (a larger block, or a lone large event, is a
    run of its own)."""
    runs: list[list[BlockRow]] = []
    size = RUN_BYTES
    for row in rows:
        if _large_event(row) or size + row.length > RUN_BYTES:
            runs.append([row])
            size = RUN_BYTES if _large_event(row) else row.length
        else:
            runs[-1].append(row)
            size += row.length
    return runs


def check_run(reader: BlockReader, rows: list[BlockRow]) -> CheckedRun:
    """Read one run and check each of its blocks."""
    if len(rows) == 1 and _large_event(rows[0]):
        try:
            row, payload, frames = reader._large_event(rows[0])
        except BadBlock as bad:
            return CheckedRun(b"", [], bad)
        return CheckedRun(payload, [(row, 0, frames)], None)
    size = rows[-1].end - rows[0].offset
    view = memoryview(reader.buffers.get(size))[:size]
    view = view[: reader.segfile.read_into(view, rows[0].offset)].toreadonly()
    pos, blocks = 0, []
    for row in rows:
        try:
            header, body = _checked(view, pos, row)
            frames = reader.frames(header, body)
        except BadBlock as bad:
            return CheckedRun(view, blocks, bad)
        blocks.append((row, pos + header.body_offset - row.offset, frames))
        pos += row.length
    return CheckedRun(view, blocks, None)


def checked_runs(reader: BlockReader, rows: list[BlockRow]) -> Iterator[CheckedRun]:
    """Each run of `rows` (contiguous), checked, in order; stops after the first run with
    damage. (A second thread checking runs ahead was measured slower, on an idle machine as on
    a busy one: its hand-offs cost more than the overlap won.)"""
    for run in plan_runs(rows):
        checked = check_run(reader, run)
        damage = checked.damage
        yield checked
        del checked  # (the caller released it: its buffer serves a later run)
        if damage is not None:
            return


def _covering(rows: list[BlockRow], start: int, end: int) -> Iterator[list[BlockRow]]:
    """The contiguous stretches of `rows`; a gap (before the first, between two, after the
    last, up to `end`) raises `BadBlock` after the stretch before it: the index covers a
    segment's data without holes."""
    expected, i = (min(start, rows[0].offset) if rows else start), 0
    while True:
        j = i
        while j < len(rows) and rows[j].offset == expected:
            expected = rows[j].end
            j += 1
        if j > i:
            yield rows[i:j]
        if j < len(rows):
            msg = f"the index has no block here (the next one starts at {rows[j].offset})"
            raise BadBlock(expected, msg)
        if expected < end:
            raise BadBlock(expected, "the index has no block here (nor after)")
        return


def read_events(
    reader: BlockReader, stream: str, segment: int, rows: list[BlockRow], *, start: int, end: int
) -> Iterator[Event]:
    """Events in [start, end) of `rows`, the index rows that cover that range, in order, each
    payload copied into its own bytes (a lone large event's bytes are its run's)."""
    for stretch in _covering(rows, start, end):
        for run in checked_runs(reader, stretch):
            data = run.data
            whole = isinstance(data, bytes)  # a lone large event's payload: not copied
            for row, base, frames in run.blocks:
                ns = row.ingest_ns
                for off, end_off, key, at, until in _inside(row, frames, start, end):
                    payload = data if whole else bytes(data[base + at : base + until])
                    yield _event(stream, segment, off, end_off, key, payload, ns)
            del data
            run.release()
            if run.damage is not None:
                raise run.damage


def read_batches(
    reader: BlockReader, stream: str, segment: int, rows: list[BlockRow], *, start: int, end: int
) -> Iterator[EventBatch]:
    """The events of `read_events`, a batch per run, their payloads slices of the run's bytes."""
    for stretch in _covering(rows, start, end):
        for run in checked_runs(reader, stretch):
            batch = _batch(run, stream, segment, start, end)
            run.release()  # the batch holds the buffer for as long as it is kept
            if len(batch):
                yield batch
            # Not kept past its yield: a caller done with it frees its buffer for the next run
            # (one warm buffer read into again, 10% faster than two taken in turns).
            del batch
            if run.damage is not None:
                raise run.damage


def _batch(run: CheckedRun, stream: str, segment: int, start: int, end: int) -> EventBatch:
    """The events of a run in [start, end) as columns, payload positions relative to its data."""
    columns: tuple[list, ...] = ([], [], [], [], [], [])
    offsets, ends, keys, starts, stops, times = columns
    for row, base, frames in run.blocks:
        inside = _inside(row, frames, start, end)
        offsets += [f[0] for f in inside]
        ends += [f[1] for f in inside]
        keys += [f[2] for f in inside]
        starts += [base + f[3] for f in inside]
        stops += [base + f[4] for f in inside]
        times += [row.ingest_ns] * len(inside)
    return EventBatch(stream, segment, run.data, offsets, ends, keys, starts, stops, times)


def _inside(row: BlockRow, frames: list[Frame], start: int, end: int) -> list[Frame]:
    """The frames of the block `row` that lie in [start, end) (found by bisection: a few
    events of a block of thousands are read without a look at the others)."""
    if start <= row.offset and row.end <= end:
        return frames
    first = bisect.bisect_left(frames, start, key=_OFFSET)
    return frames[first : bisect.bisect_right(frames, end, lo=first, key=_END)]


_OFFSET, _END = operator.itemgetter(0), operator.itemgetter(1)

#: `read_events` or `read_batches`: what a range read hands out.
Reading = Callable[..., Iterator]
