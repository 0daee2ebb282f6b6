"""Reading a stream into Spark: batch and streaming readers of the `sluice` data source.

Offsets are stream cuts (`{"cut": "<cut text>"}`); a batch covers the events between two cuts,
planned as segment ranges split at event boundaries. `latestOffset`, `partitions` and `commit`
run on the driver; `read` runs in executors, which open the store by its URI. Admission
control and `Trigger.AvailableNow` follow Spark 4.2's Python API. Delivery: the reader holds
no state and reads the same events for the same cuts, so with a checkpoint Spark's replay of a
failed batch gives exactly-once input to an idempotent sink. Details: `DESIGN.md`, "Reading"."""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from pipeline.spark.errors import OptionError
from pipeline.spark.options import SOURCE, SourceOptions, resolve_cut, source_store
from pipeline.streams import (
    EventBatch,
    StreamCut,
    StreamStore,
    parse_stream,
)

EVENT_SCHEMA = (
    "stream string, segment int, offset long, end_offset long, routing_key string, "
    "payload binary, ingest_time timestamp"
)
ARROW_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("segment", pa.int32()),
        ("offset", pa.int64()),
        ("end_offset", pa.int64()),
        ("routing_key", pa.string()),
        ("payload", pa.binary()),
        ("ingest_time", pa.timestamp("us", tz="UTC")),
    ]
)
RANGE_SCHEMA = "store string, stream string, segment int, start long, end long"
RANGE_ARROW = pa.schema(
    [
        ("store", pa.string()),
        ("stream", pa.string()),
        ("segment", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
    ]
)
BATCH_EVENTS = 4096
BATCH_BYTES = 32 << 20

Positions = dict[int, int]


class SegmentRange(InputPartition):
    """One task's work: the events of one segment in [start, end)."""

    def __init__(self, store: str, stream: str, segment: int, start: int, end: int) -> None:
        self.store, self.stream = store, stream
        self.segment, self.start, self.end = segment, start, end


def offset_of(cut: StreamCut) -> dict:
    return {"cut": cut.text}


def cut_of(offset: dict, stream: str) -> StreamCut:
    scope, name = parse_stream(stream)
    return StreamCut.parse(offset["cut"]).check_stream(scope, name)


def plan_ranges(
    store: StreamStore, opts: SourceOptions, start: StreamCut, end: StreamCut
) -> list[SegmentRange]:
    """Segment ranges covering [start, end), split so that about `min_partitions` tasks run
    (a segment created since `start` from its offset 0: `StreamCut.spans_until`)."""
    spans = [(seg, s, e) for seg, s, e in start.spans_until(end) if s < e]
    total = sum(e - s for _, s, e in spans) or 1
    ranges: list[SegmentRange] = []
    for seg, s, e in spans:
        share = round(opts.min_partitions * (e - s) / total)
        parts = max(1, min(share, (e - s) // opts.min_split_bytes))
        points = store.split_points(opts.stream, seg, s, e, parts) if parts > 1 else []
        bounds = [s, *sorted(p for p in points if s < p < e), e]
        ranges += [SegmentRange(opts.store, opts.stream, seg, a, b) for a, b in pairwise(bounds)]
    return ranges


def read_partition(part: SegmentRange, emit: str) -> Iterator[pa.RecordBatch]:
    """Executor side: the range's events, or (`emit=ranges`) the range itself as one row."""
    if emit == "ranges":
        row = [[part.store], [part.stream], [part.segment], [part.start], [part.end]]
        return iter([pa.RecordBatch.from_arrays(row, schema=RANGE_ARROW)])
    return read_range(part)


def read_range(part: SegmentRange) -> Iterator[pa.RecordBatch]:
    """The events of one range as Arrow batches of the source's schema (executor side).

    The store hands out checked runs of blocks (`read_segment_batches`). Each run's payloads
    are copied at once into the Arrow buffer of the batch being built and the run is let go,
    so the store reads the next run into the same warm buffer; no Python object is made per
    event. (Runs kept until their Arrow batch was built each took a fresh buffer, and joining
    their payloads a fresh 32 MiB: a range read ran at a tenth of a plain file read.)"""
    with source_store(part.store) as store:
        building: ArrowBatch | None = None
        for batch in store.read_segment_batches(part.stream, part.segment, part.start, part.end):
            if building is not None and batch.nbytes > building.room:
                yield building.done()
                building = None
            if building is None:
                building = ArrowBatch(part, batch.nbytes, part.end - batch.offsets[0])
            building.add(batch)
            del batch  # (its run buffer is free for the next run)
            if building.count >= BATCH_EVENTS or building.room == 0:
                yield building.done()
                building = None
        if building is not None:
            yield building.done()


class ArrowBatch:
    """One Arrow batch of a range being built from the store's batches: its columns, and the
    payloads copied into one Arrow buffer of `BATCH_BYTES` (less when the rest of the range
    is smaller; more for a run that is larger), cut to what it holds when done."""

    def __init__(self, part: SegmentRange, first: int, rest_of_range: int) -> None:
        self.part = part
        self._values = pa.allocate_buffer(
            max(first, min(BATCH_BYTES, rest_of_range)), resizable=True
        )
        self._view = memoryview(self._values).cast("B")
        self._size = 0
        self.count = 0
        self._offsets: list[int] = []
        self._ends: list[int] = []
        self._keys: list[str | None] = []
        self._stops: list[int] = []  # where each payload ends in the buffer
        self._times_us: list[int] = []

    @property
    def room(self) -> int:
        """Payload bytes still free in the buffer."""
        return len(self._view) - self._size

    def add(self, batch: EventBatch) -> None:
        """Copy the payloads of `batch` in and take its columns (the batch is not kept)."""
        data, view, at, stops = memoryview(batch.data), self._view, self._size, self._stops
        for start, end in zip(batch.starts, batch.ends, strict=True):
            stop = at + end - start
            view[at:stop] = data[start:end]
            stops.append(stop)
            at = stop
        self._size = at
        self.count += len(batch)
        self._offsets += batch.offsets
        self._ends += batch.end_offsets
        self._keys += batch.routing_keys
        # Timestamps are built from int64 values: converting Python ints to a time-zoned
        # timestamp type makes pyarrow import pandas (seconds, once per worker).
        self._times_us += [ns // 1000 for ns in batch.ingest_times_ns]

    def done(self) -> pa.RecordBatch:
        """The Arrow batch; its payload buffer cut to what it holds."""
        self._view.release()
        self._values.resize(self._size, shrink_to_fit=True)
        offsets = pa.array([0, *self._stops], pa.int32())
        payloads = pa.Array.from_buffers(
            pa.binary(), self.count, [None, offsets.buffers()[1], self._values]
        )
        ingest = pa.array(self._times_us, pa.int64())
        columns = [
            pa.array([self.part.stream] * self.count, pa.string()),
            pa.array([self.part.segment] * self.count, pa.int32()),
            pa.array(self._offsets, pa.int64()),
            pa.array(self._ends, pa.int64()),
            pa.array(self._keys, pa.string()),
            payloads,
            ingest.view(pa.timestamp("us", tz="UTC")),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=ARROW_SCHEMA)


class SluiceBatchReader(DataSourceReader):
    """A bounded read between two cuts, both fixed when the query is planned (driver)."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        with source_store(opts.store) as store:
            self.start = resolve_cut(store, opts.stream, opts.starting, "startingCut")
            self.end = resolve_cut(store, opts.stream, opts.ending or "tail", "endingCut")
            check_order(self.start, self.end)
            self.ranges = plan_ranges(store, opts, self.start, self.end)

    def partitions(self) -> list[SegmentRange]:
        return self.ranges

    def read(self, partition: SegmentRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(partition, self.opts.emit)


def check_order(start: StreamCut, end: StreamCut) -> None:
    for seg, first, stop in start.spans_until(end):
        if stop < first:
            reason = f"the ending cut is before the starting cut in segment {seg}"
            raise OptionError(SOURCE, "endingCut", end.text, reason)


class SluiceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches between cuts, with admission control and `Trigger.AvailableNow`."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.target: StreamCut | None = None
        self._store: StreamStore | None = None

    @property
    def store(self) -> StreamStore:
        if self._store is None:
            self._store = source_store(self.opts.store)
        return self._store

    def initialOffset(self) -> dict:
        start = resolve_cut(self.store, self.opts.stream, self.opts.starting, "startingCut")
        return offset_of(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_events is not None:
            return ReadMaxRows(self.opts.max_events)
        if self.opts.max_bytes is not None:
            return ReadMaxBytes(self.opts.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.store.tail(self.opts.stream)

    def reportLatestOffset(self) -> dict:
        return offset_of(self.store.tail(self.opts.stream))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self._stop_requested():
            return start  # nothing more: Spark plans no batch (`SourceOptions`, "stop")
        begin = cut_of(start, self.opts.stream)
        ceiling = self._ceiling(begin)
        if isinstance(limit, ReadAllAvailable):
            return offset_of(ceiling)
        max_events = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        if max_events is not None and max_bytes is None:
            max_bytes = self.opts.max_bytes  # both options set: Spark passes the first
        admitted = admit(
            self.store,
            self.opts.stream,
            begin=begin,
            ceiling=ceiling,
            max_events=max_events,
            max_bytes=max_bytes,
        )
        return offset_of(admitted)

    def _stop_requested(self) -> bool:
        """Whether the job asked its query to stop (`stopRequest` exists); if so, say that this
        source saw it (`stopSeen`). Spark asks for offsets at the start of a trigger, after
        the previous batch's commit, so the batch before this call is done."""
        request, seen = self.opts.stop_request, self.opts.stop_seen
        if request is None or not os.path.exists(request):
            return False
        if seen is not None:
            Path(seen).touch()
        return True

    def _ceiling(self, begin: StreamCut) -> StreamCut:
        """The furthest cut a batch may reach: the tail (or AvailableNow's), capped by the end."""
        tail = self.target or self.store.tail(self.opts.stream)
        begin.check_same_stream(tail)  # `StaleCut`: the stream was created again since
        limit = tail.segments
        if self.opts.ending is not None:
            ending = resolve_cut(self.store, self.opts.stream, self.opts.ending, "endingCut")
            limit = {seg: min(off, ending.segments.get(seg, off)) for seg, off in limit.items()}
        start = begin.segments
        limit = {seg: max(off, start.get(seg, 0)) for seg, off in limit.items()}
        return tail.moved_to({**start, **limit})

    def partitions(self, start: dict, end: dict) -> list[SegmentRange]:
        begin, finish = cut_of(start, self.opts.stream), cut_of(end, self.opts.stream)
        head = self.store.head(self.opts.stream)  # a batch planned before a restart, too
        begin, finish = begin.check_same_stream(head), finish.check_same_stream(head)
        return plan_ranges(self.store, self.opts, begin, finish)

    def read(self, partition: SegmentRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return read_partition(partition, self.opts.emit)

    def commit(self, end: dict) -> None:
        """Nothing to do: Spark's checkpoint holds the position; the store keeps all data."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def admit(
    store: StreamStore,
    stream: str,
    *,
    begin: StreamCut,
    ceiling: StreamCut,
    max_events: int | None,
    max_bytes: int | None,
) -> StreamCut:
    """The cut after at most `max_events` events / `max_bytes` payload bytes past `begin`.

    The budget is shared fairly among the segments that have data, round by round; a batch
    always admits at least one event when one is available, even one larger than `max_bytes`.
    """
    pos, top = begin.segments, ceiling.segments
    for seg in top:  # created by a scale after `begin`: from offset 0 (see `plan_ranges`)
        pos.setdefault(seg, 0)
    events_left = max_events if max_events is not None else float("inf")
    bytes_left = max_bytes if max_bytes is not None else float("inf")
    order = successor_order(store, stream)
    admitted_any = False
    while events_left > 0 and bytes_left > 0:
        ready = [s for s in sorted(top) if pos[s] < top[s] and order.ready(s, pos, top)]
        share_events = max(1, int(events_left // max(1, len(ready)))) if max_events else None
        share_bytes = max(1, int(bytes_left // max(1, len(ready)))) if max_bytes else None
        progress = False
        for seg in ready:
            new, events, size = _advance(
                store,
                stream,
                seg,
                (pos[seg], top[seg]),
                max_events=share_events,
                max_bytes=share_bytes,
                admitted_any=admitted_any,
            )
            pos[seg] = new
            progress = progress or events > 0
            admitted_any = admitted_any or events > 0
            events_left -= events
            bytes_left -= size
            if events_left <= 0 or bytes_left <= 0:
                break
        if not progress:
            break
    return ceiling.moved_to(pos)


def _advance(
    store: StreamStore,
    stream: str,
    segment: int,
    span: tuple[int, int],
    *,
    max_events: int | None,
    max_bytes: int | None,
    admitted_any: bool,
) -> tuple[int, int, int]:
    """Walk one segment from `span[0]`: the new position, events and bytes admitted."""
    start, end = span
    pos, events, size = start, 0, 0
    for event in store.read_segment(stream, segment, start, end):
        grown = size + len(event.payload)
        if max_bytes is not None and grown > max_bytes and (events or admitted_any):
            break
        pos, events, size = event.end_offset, events + 1, grown
        if max_events is not None and events >= max_events:
            break
    return pos, events, size


class SuccessorOrder:
    """Which segments may be read: a successor only after its sealed predecessors end."""

    def __init__(self, predecessors: dict[int, list[int]]) -> None:
        self.predecessors = predecessors

    def ready(self, segment: int, pos: Positions, top: Positions) -> bool:
        return all(pos.get(p, 0) >= top.get(p, 0) for p in self.predecessors.get(segment, []))


def successor_order(store: StreamStore, stream: str) -> SuccessorOrder:
    """Predecessors by key-range overlap among lower-numbered sealed segments (from `info`)."""
    segments = store.info(stream).segments
    found: dict[int, list[int]] = {}
    for seg in segments:
        lo, hi = seg.key_range
        found[seg.segment] = [
            p.segment
            for p in segments
            if p.segment < seg.segment and p.sealed and p.key_range[0] < hi and lo < p.key_range[1]
        ]
    return SuccessorOrder(found)
