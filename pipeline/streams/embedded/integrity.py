"""Verify and repair an embedded store whose catalog is readable.

`verify` reads every stored block from each segment's head on (checksum, frames, header against
index), checks the index for holes and the file for a tail that is missing, torn or damaged,
the bodies of open transactions, the manifests and the catalog database itself; it changes
nothing. `repair` fixes what needs no guess: manifests, a torn tail past the indexed end,
index rows of bytes the file no longer holds, writer positions, stale damage marks. A segment
left with lost or unreadable data is sealed and its key range continues in a new segment, so
writes resume and no offset is ever reused; that data is reported as not fixable. A catalog
that is lost, foreign or unreadable is rebuilt from the data files (rebuild.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.streams.embedded.blocks import BadBlock, body_magic, checksum_for
from pipeline.streams.embedded.engine import Engine
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.embedded.manifest import read_manifest
from pipeline.streams.embedded.reading import BlockReader
from pipeline.streams.embedded.scaling import scale
from pipeline.streams.errors import InvalidCut, SegmentNotActive, StreamNotFound, StreamSealed
from pipeline.streams.names import parse_stream
from pipeline.streams.values import Problem, Progress, RepairReport, VerifyReport
from pipeline.wording import counted

END = 2**63 - 1


@dataclass
class Tally:
    """Problems found so far, and progress in bytes over the whole run."""

    progress: Progress | None
    total: int
    done: int = 0
    blocks: int = 0
    segments: int = 0
    problems: list[Problem] = field(default_factory=list)
    fixed: list[Problem] = field(default_factory=list)

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)

    def finish(self) -> None:
        """The last report: all done (blocks before a head were counted but not read)."""
        if self.progress is not None:
            self.progress(self.total, self.total)


def streams_to_check(engine: Engine, stream: str | None) -> list[StreamRow]:
    """The live streams to check: one by name, or all of them (no first-use repairs)."""
    if stream is not None:
        scope, name = parse_stream(stream)
        row = engine.lookup(scope, name)
        if row is None:
            raise StreamNotFound(scope, name)
        return [row]
    rows = engine.catalog.query("SELECT id, scope, name FROM streams WHERE deleted=0 ORDER BY id")
    return [StreamRow(*r) for r in rows]


def stored_bytes(engine: Engine, rows: list[StreamRow]) -> int:
    total = 0
    for row in rows:
        for seg, _, _ in engine.segments(row):
            path = engine.segment_file(row, seg).path
            total += path.stat().st_size if path.exists() else 0
    return total


def verify(engine: Engine, stream: str | None, progress: Progress | None) -> VerifyReport:
    """Check everything stored for `stream` (all streams by default); change nothing."""
    rows = streams_to_check(engine, stream)
    tally = Tally(progress, stored_bytes(engine, rows))
    check_catalog(engine, rows, tally)
    for row in rows:
        for seg, _, _ in engine.segments(row):
            check_segment(engine, row, seg, tally)
        check_transactions(engine, row, tally)
    tally.finish()
    return VerifyReport(tuple(tally.problems), len(rows), tally.segments, tally.blocks, tally.done)


def check_catalog(engine: Engine, rows: list[StreamRow], tally: Tally) -> None:
    found = engine.catalog.query("PRAGMA quick_check")
    if found != [("ok",)]:
        what = f"the catalog database is damaged ({found[0][0]}); repair rebuilds it"
        tally.problems.append(Problem(None, None, None, what, fixable=True))
    for row in rows:
        try:
            manifest = read_manifest(engine.root, row.id)
        except ValueError as exc:
            manifest, why = None, f"its manifest is unreadable ({exc})"
        else:
            why = "its manifest is missing" if manifest is None else "its manifest is stale"
        if manifest != engine.manifest(row.id):
            tally.problems.append(Problem(row.qualified, None, None, why, fixable=True))


def check_segment(engine: Engine, row: StreamRow, segment: int, tally: Tally) -> None:
    """Every block from the head on, the index for holes, the file for a bad tail."""
    tally.segments += 1
    segfile = engine.segment_file(row, segment)
    start = head_block(engine, row, segment)
    rows = engine.blocks(row, segment, start, END)
    if not segfile.path.exists():
        if rows:
            add(tally, row, segment, start, "the segment file is missing", fixable=False)
        return
    before = len(tally.problems)
    size, expected = segfile.size(), start
    reader = BlockReader(segfile)
    for block in rows:
        if block.end > size:
            lost = f"the segment file ends at {size}: the indexed data from here on is lost"
            add(tally, row, segment, block.offset, lost, fixable=False)
            break
        if block.offset != expected:
            add(
                tally, row, segment, expected, f"the index has no block here (next: {block.offset})"
            )
        try:
            reader.block(block)
        except BadBlock as bad:
            add(tally, row, segment, bad.offset, bad.problem)
        expected = block.end
        tally.blocks += 1
        tally.advance(block.length)
    check_unindexed(engine, row, segment, max(expected, start), tally)
    mark = engine.damage(row, segment)
    if mark is not None and len(tally.problems) == before:
        what = f"marked damaged ({mark[1]}) but reads clean now; repair clears the mark"
        add(tally, row, segment, mark[0], what, fixable=True)


def check_unindexed(engine: Engine, row: StreamRow, segment: int, end: int, tally: Tally) -> None:
    """Bytes past the index: valid blocks are fine (the next reader indexes them); a torn
    tail is fixable; invalid bytes with valid blocks after them are damage."""
    segfile = engine.segment_file(row, segment)
    if segfile.size() <= end:
        return
    with segfile.try_locked() as locked:
        if not locked:  # being appended to right now: its tail is not settled
            return
        survey = segfile.survey(end)
    for bad, later in survey.damaged:
        what = f"{counted(later - bad, 'byte')} are no valid block, but valid blocks follow"
        what += f" at {later}"
        add(tally, row, segment, bad, what, fixable=False)
    if survey.torn_tail is not None:
        torn, size = survey.torn_tail
        add(tally, row, segment, torn, f"a torn tail of {size - torn} bytes", fixable=True)
    tally.advance(survey.size - end)


def check_transactions(engine: Engine, row: StreamRow, tally: Tally) -> None:
    """The flushed events of open and half-committed transactions are whole."""
    for txn_id, segment, body_len, body_crc in engine.catalog.query(
        "SELECT t.txn_id, ts.segment, ts.body_len, ts.body_crc FROM txns t JOIN txn_segments ts"
        " USING (txn_id) WHERE t.stream_id=? AND t.state IN ('open', 'committing')"
        " AND ts.done=0 AND ts.body_len>0",
        (row.id,),
    ):
        path = engine.root / "txn" / f"{txn_id}.{segment}.body"
        problem = body_problem(path, body_len, body_crc)
        if problem is not None:
            what = f"transaction {txn_id}: its flushed events {problem}; abort it"
            add(tally, row, segment, None, what, fixable=False)


def body_problem(path: Path, body_len: int, body_crc: int) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return f"are missing ({path.name})"
    sums = checksum_for(body_magic(body_crc, body_len))
    try:
        crc, pos = 0, 0
        while pos < body_len and (chunk := os.pread(fd, min(1 << 24, body_len - pos), pos)):
            crc, pos = sums(chunk, crc), pos + len(chunk)
    finally:
        os.close(fd)
    if pos < body_len:
        return f"are cut short ({pos} of {body_len} bytes in {path.name})"
    return None if crc == body_crc & 0xFFFFFFFF else f"fail their checksum ({path.name})"


def head_block(engine: Engine, row: StreamRow, segment: int) -> int:
    """Where a segment's readable data starts: the block that holds its head."""
    head = engine.segment_head(row, segment)
    block = engine.block_at(row, segment, head)
    return block.offset if block is not None else head


def add(
    tally: Tally,
    row: StreamRow,
    segment: int,
    offset: int | None,
    what: str,
    *,
    fixable: bool = False,
) -> None:
    tally.problems.append(Problem(row.qualified, segment, offset, what, fixable))


# --- repair -------------------------------------------------------------------------------
def repair(engine: Engine, stream: str | None, progress: Progress | None) -> RepairReport:
    """Fix what needs no guess in `stream` (all streams by default); report the rest."""
    rows = streams_to_check(engine, stream)
    tally = Tally(progress, stored_bytes(engine, rows))
    for row in rows:
        manifest_before = _manifest_or_none(engine, row)
        engine.sync_manifest(row)
        if manifest_before != engine.manifest(row.id):
            tally.fixed.append(Problem(row.qualified, None, None, "rewrote its manifest", True))
        for seg, lo, hi in engine.segments(row):
            if not repair_segment(engine, row, seg, tally):
                seal_and_continue(engine, row, seg, (lo, hi), tally)
    tally.finish()
    return RepairReport(tuple(tally.fixed), tuple(tally.problems))


def _manifest_or_none(engine: Engine, row: StreamRow) -> object:
    try:
        return read_manifest(engine.root, row.id)
    except ValueError:
        return None


def repair_segment(engine: Engine, row: StreamRow, segment: int, tally: Tally) -> bool:
    """Bring a segment's index in line with its file; True if it is whole afterwards."""
    tally.segments += 1
    segfile = engine.segment_file(row, segment)
    before = len(tally.problems)
    missing = not segfile.path.exists()  # (locking it makes an empty one)
    with segfile.locked():
        drop_lost_rows(engine, row, segment, size=segfile.size(), tally=tally, missing=missing)
        start = head_block(engine, row, segment)
        survey = segfile.survey(start)
        rows = engine.blocks(row, segment, start, END)
        valid = {h.offset: h for h in survey.blocks}
        end = rows[-1].end if rows else start
        for block in rows:
            found = valid.get(block.offset)
            if found is None or found.length != block.length:
                what = (
                    f"a damaged block of {counted(block.events, 'event')} that cannot be read;"
                    f" reads stop here, {read_past(engine, row, segment, block.end)}"
                )
                add(tally, row, segment, block.offset, what)
        # Valid blocks past bytes that are no block are indexed too, so that a cut past the
        # damage reaches them: the damage is then a hole in the index, reported on every run
        # until a person decides (the segment is sealed; its writes continue in a new one).
        engine.index_blocks(row, segment, [h for h in survey.blocks if h.offset >= end])
        for at, later in index_holes(engine.blocks(row, segment, start, END), start):
            what = (
                f"{counted(later - at, 'byte')} that are no valid block; reads stop here,"
                f" {read_past(engine, row, segment, later)}"
            )
            add(tally, row, segment, at, what)
        if survey.torn_tail is not None and survey.size > end:
            cut_at = max(survey.torn_tail[0], end)
            segfile.repair(cut_at)
            what = f"cut a torn tail of {survey.size - cut_at} bytes"
            tally.fixed.append(Problem(row.qualified, segment, cut_at, what, True))
        tally.advance(survey.size - start)
    whole = len(tally.problems) == before
    if whole and engine.damage(row, segment) is not None:
        engine.clear_damage(row, segment)
        tally.fixed.append(Problem(row.qualified, segment, None, "cleared its damage mark", True))
    return whole


def index_holes(rows: list, start: int) -> list[tuple[int, int]]:
    """(where, up to where) of each stretch between `start` and the last of the index rows
    `rows` that no row covers."""
    holes, expected = [], start
    for block in rows:
        if block.offset > expected:
            holes.append((expected, block.offset))
        expected = max(expected, block.end)
    return holes


def read_past(engine: Engine, row: StreamRow, segment: int, offset: int) -> str:
    """How to read on after damage that ends at `offset`: the cut there (every other segment
    at its head), as `sluice store read --from` takes it."""
    head = engine.head(row)
    cut = head.moved_to({**head.segments, segment: offset})
    return f"`sluice store read {row.qualified} --from {cut.text}` reads on after it"


def drop_lost_rows(
    engine: Engine, row: StreamRow, segment: int, *, size: int, tally: Tally, missing: bool
) -> None:
    """Remove the index rows of blocks the file no longer holds (it is shorter than its
    index); the head, and reader group positions, past the new end move back to it."""
    lost = [b for b in engine.blocks(row, segment, 0, END) if b.end > size]
    if not lost:
        return
    first = lost[0].offset
    head = engine.segment_head(row, segment)
    readable = [b for b in lost if b.end > head]
    if readable:
        events = sum(b.events for b in readable)
        gone = "the segment file was missing" if missing else f"the segment file ends at {size}"
        what = (
            f"{gone}: {counted(events, 'event')} in"
            f" {counted(len(readable), 'block')} from"
            f" {max(readable[0].offset, head)} to {readable[-1].end} are lost"
        )
        add(tally, row, segment, max(readable[0].offset, head), what)
    with engine.changing(row) as db:  # one transaction: rows, head and positions move together
        db.execute(
            "DELETE FROM blocks WHERE stream_id=? AND segment=? AND offset>=?",
            (row.id, segment, first),
        )
        db.execute(
            "UPDATE segments SET head=MIN(head, ?) WHERE stream_id=? AND segment=?",
            (first, row.id, segment),
        )
        db.execute(
            "UPDATE rg_positions SET offset=? WHERE segment=? AND offset>? AND group_name IN"
            " (SELECT name FROM reader_groups WHERE stream_id=?)",
            (first, segment, first, row.id),
        )
    fixed = f"dropped the index rows of {counted(len(lost), 'block')} the file no longer holds"
    tally.fixed.append(Problem(row.qualified, segment, first, fixed, True))


def seal_and_continue(
    engine: Engine, row: StreamRow, segment: int, key_range: tuple[float, float], tally: Tally
) -> None:
    """Seal a segment repair could not make whole; a new segment takes its key range, so
    writes resume and no offset of the damaged one is ever written again."""
    try:
        created = scale(engine, row, [segment], [key_range])
    except (StreamSealed, SegmentNotActive, InvalidCut):
        return  # sealed already (or a transaction is landing: the damage mark stays)
    engine.clear_damage(row, segment)
    what = f"sealed it: its keys continue in segment {created[0]}"
    tally.fixed.append(Problem(row.qualified, segment, None, what, True))
