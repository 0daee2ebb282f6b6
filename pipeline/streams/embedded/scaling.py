"""Scaling the segments of an embedded stream: split hot ones, merge cold ones.

A scale seals some segments and creates successors that cover exactly the same key range;
`segment_predecessors` records who came from whom. Per-key order holds because:
- appends: a writer checks, under the segment's lock, that the segment is not sealed, and
  re-routes its events to the successors if it is (the seal itself takes the same locks, as
  does sealing the whole stream: `active_segments_locked`);
- transactions: a transaction whose events were routed to a segment sealed since is rebased
  onto the successors when it commits (its events re-routed by key, before it is `committing`);
- reads: successors have higher numbers and bounded reads go in ascending segment order; reader
  groups hand out a successor only once every predecessor is sealed and read to its end.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from pipeline.streams.embedded.engine import Engine
from pipeline.streams.embedded.index import StreamRow
from pipeline.streams.errors import InvalidArgument, InvalidCut, SegmentNotActive, StreamSealed
from pipeline.streams.values import MAX_SEGMENTS, ScalingPolicy

EPSILON = 1e-12


def scale(
    engine: Engine, row: StreamRow, seal: list[int], ranges: list[tuple[float, float]]
) -> list[int]:
    active = {seg: (lo, hi) for seg, lo, hi in engine.segments(row, active_only=True)}
    if engine.is_sealed(row):
        raise StreamSealed(row.scope, row.name)
    for seg in seal:
        if seg not in active:
            raise SegmentNotActive(row.qualified, seg, sorted(active))
    _check_cover(row, [active[s] for s in seal], ranges)
    if len(active) - len(seal) + len(ranges) > MAX_SEGMENTS:
        rule = (
            f"{row.qualified} has {len(active)} active segments, and a stream has at most"
            f" {MAX_SEGMENTS}: split into fewer parts, or merge cold segments first"
        )
        raise InvalidArgument(name="number of new segments", value=len(ranges), rule=rule)
    with ExitStack() as locks:
        for seg in sorted(seal):  # block appends to the sealed segments while they change
            locks.enter_context(engine.segment_file(row, seg).locked())
        with engine.changing(row) as db:
            busy = db.execute(
                "SELECT COUNT(*) FROM txn_segments ts JOIN txns t USING (txn_id)"
                " WHERE t.stream_id=? AND t.state='committing' AND ts.done=0"
                f" AND ts.segment IN ({','.join('?' * len(seal))})",
                (row.id, *seal),
            ).fetchone()[0]
            if busy:
                msg = "a transaction is landing in these segments right now; try again"
                raise InvalidCut(text=",".join(map(str, seal)), reason=msg)
            first = db.execute(
                "SELECT MAX(segment) + 1 FROM segments WHERE stream_id=?", (row.id,)
            ).fetchone()[0]
            created = list(range(first, first + len(ranges)))
            db.executemany(
                "UPDATE segments SET sealed=1 WHERE stream_id=? AND segment=?",
                [(row.id, s) for s in seal],
            )
            db.executemany(
                "INSERT INTO segments(stream_id, segment, key_lo, key_hi) VALUES (?, ?, ?, ?)",
                [(row.id, seg, lo, hi) for seg, (lo, hi) in zip(created, ranges, strict=True)],
            )
            db.executemany(
                "INSERT INTO segment_predecessors(stream_id, segment, predecessor)"
                " VALUES (?, ?, ?)",
                [
                    (row.id, new, old)
                    for new, (lo, hi) in zip(created, ranges, strict=True)
                    for old in seal
                    if active[old][0] < hi - EPSILON and lo < active[old][1] - EPSILON
                ],
            )
    return created


@contextmanager
def active_segments_locked(engine: Engine, row: StreamRow) -> Iterator[list[int]]:
    """Hold the locks of the stream's active segments, taken in segment order as a scale takes
    them: no append or commit lands in the stream meanwhile. The active segments are listed
    again under the locks, and the locks taken again, until no scale replaced some between."""
    while True:
        active = [seg for seg, _, _ in engine.segments(row, active_only=True)]
        with ExitStack() as locks:
            for seg in active:
                locks.enter_context(engine.segment_file(row, seg).locked())
            if [seg for seg, _, _ in engine.segments(row, active_only=True)] == active:
                yield active
                return


def _check_cover(
    row: StreamRow, old: list[tuple[float, float]], new: list[tuple[float, float]]
) -> None:
    """The new ranges must tile exactly the key space of the old ones."""

    def tiles(ranges: list[tuple[float, float]]) -> tuple[float, float] | None:
        ranges = sorted(ranges)
        for (_, hi), (lo, _) in itertools.pairwise(ranges):
            if abs(hi - lo) > EPSILON:
                return None
        return (ranges[0][0], ranges[-1][1]) if ranges else None

    span_old, span_new = tiles(old), tiles(new)
    if (
        not new
        or span_old is None
        or span_new is None
        or any(not lo < hi for lo, hi in new)  # (NaN is not below anything)
        or (abs(span_old[0] - span_new[0]) > EPSILON or abs(span_old[1] - span_new[1]) > EPSILON)
    ):
        rule = (
            f"they must exactly cover {sorted(old)}, the key ranges of the segments of"
            f" {row.qualified} they replace"
        )
        raise InvalidArgument(name="key ranges", value=new, rule=rule)


@dataclass(frozen=True, slots=True)
class AutoScalePlan:
    """What a scaling policy asks for now: split each hot segment, else merge one cold pair."""

    split: list[int]
    merge: tuple[int, int] | None


def plan_auto_scale(
    engine: Engine,
    row: StreamRow,
    policy: ScalingPolicy,
    window_seconds: float,
    now_ns: int | None = None,
) -> AutoScalePlan:
    """Segments whose recent rate exceeds the target, and the first pair of neighbours whose
    rates together are under half of it (merged only when there is nothing to split)."""
    now_ns = now_ns or time.time_ns()
    since = now_ns - int(window_seconds * 1e9)
    active = engine.segments(row, active_only=True)
    rates = {}
    for seg, _, _ in active:
        engine.catch_up(row, seg)
        events, size = engine.catalog.query_one(
            "SELECT COALESCE(SUM(events), 0), COALESCE(SUM(length), 0) FROM blocks"
            " WHERE stream_id=? AND segment=? AND ingest_ns>=?",
            (row.id, seg, since),
            index=True,
        )
        amount = events if policy.kind == "events_per_second" else size / 1024
        rates[seg] = amount / window_seconds
    hot = [seg for seg, _, _ in active if rates[seg] > policy.target]
    count = len(active)
    for (a, _, a_hi), (b, b_lo, _) in itertools.pairwise(active):
        adjacent = abs(a_hi - b_lo) <= EPSILON
        if adjacent and count > policy.min_segments and rates[a] + rates[b] < policy.target / 2:
            return AutoScalePlan(split=hot, merge=(a, b))
    return AutoScalePlan(split=hot, merge=None)
