"""The `sluice` source: bounded reads, partitions, admission control, AvailableNow, restarts."""

from __future__ import annotations

import itertools
import re

import pyarrow as pa
import pytest

from pipeline.spark.errors import OptionError
from pipeline.spark.options import SourceOptions
from pipeline.spark.reading import SegmentRange, admit, plan_ranges, read_range
from pipeline.streams import StreamCut
from tests.spark.conftest import fill

pytestmark = pytest.mark.spark


def positions(rows) -> list[tuple[int, int]]:
    return sorted((r["segment"], r["offset"]) for r in rows)


def test_bounded_read_returns_exactly_the_events_between_two_cuts(spark, store, store_uri, source):
    fill(store, source, 300)
    start = store.tail(source)
    fill(store, source, 200, first=300)
    end = store.tail(source)
    fill(store, source, 100, first=500)

    rows = (
        spark.read.format("sluice")
        .option("store", store_uri)
        .option("stream", source)
        .option("startingCut", start.text)
        .option("endingCut", end.text)
        .load()
        .collect()
    )
    expected = list(store.read(source, start, end))
    assert len(rows) == 200
    assert positions(rows) == sorted((e.segment, e.offset) for e in expected)
    assert sorted(r["payload"] for r in rows) == sorted(e.payload for e in expected)
    assert {r["stream"] for r in rows} == {source}
    by_position = {(e.segment, e.offset): e for e in expected}
    for row in rows:
        event = by_position[(row["segment"], row["offset"])]
        assert (row["routing_key"], row["end_offset"]) == (event.routing_key, event.end_offset)


def test_default_bounds_are_head_and_tail_and_reads_repeat(spark, store, store_uri, source):
    fill(store, source, 120)
    reader = spark.read.format("sluice").option("store", store_uri).option("stream", source)
    first = reader.load().collect()
    assert len(first) == 120
    assert positions(first) == positions(reader.load().collect())


def test_large_ranges_are_split_so_every_core_works(spark, store, store_uri, source):
    for i in range(8):  # the embedded store splits at block (flush) boundaries
        fill(store, source, 50, first=50 * i)
    df = (
        spark.read.format("sluice")
        .option("store", store_uri)
        .option("stream", source)
        .option("minPartitions", "6")
        .option("minSplitBytes", "512")
        .load()
    )
    assert df.rdd.getNumPartitions() >= 6
    rows = df.collect()
    assert len(rows) == 400 and len(set(positions(rows))) == 400


def test_planned_ranges_cover_the_cuts_in_order(store, store_uri, source):
    for _ in range(8):  # several flushes: several blocks to split at
        fill(store, source, 50)
    opts = SourceOptions.parse(
        {"store": store_uri, "stream": source, "minPartitions": "8", "minSplitBytes": "256"}
    )
    head, tail = store.head(source), store.tail(source)
    ranges = plan_ranges(store, opts, head, tail)
    assert len(ranges) > 2
    keys = [(r.segment, r.start) for r in ranges]
    assert keys == sorted(keys)
    for segment, end in tail.positions:
        mine = [r for r in ranges if r.segment == segment]
        assert mine[0].start == head.offset(segment) and mine[-1].end == end
        assert all(a.end == b.start for a, b in itertools.pairwise(mine))


def test_admission_by_events_and_bytes(store, source):
    written = fill(store, source, 100)
    head, tail = store.head(source), store.tail(source)
    cut = admit(store, source, begin=head, ceiling=tail, max_events=30, max_bytes=None)
    assert len(list(store.read(source, head, cut))) == 30
    size = sum(len(w.payload) for w in written[:10])
    cut = admit(store, source, begin=head, ceiling=tail, max_events=None, max_bytes=size)
    taken = list(store.read(source, head, cut))
    assert 0 < sum(len(e.payload) for e in taken) <= size
    huge = admit(store, source, begin=head, ceiling=tail, max_events=None, max_bytes=1)
    assert len(list(store.read(source, head, huge))) == 1  # always at least one event


def stream_batches(spark, store_uri, stream, checkpoint, **options) -> list[int]:
    reader = spark.readStream.format("sluice").option("store", store_uri).option("stream", stream)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (
        reader.load()
        .writeStream.format("memory")
        .queryName(f"q{abs(hash(str(checkpoint)))}")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [int(p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]


def test_admission_control_splits_batches(spark, store, store_uri, source, tmp_path):
    fill(store, source, 450)
    batches = stream_batches(spark, store_uri, source, tmp_path / "ck", maxEventsPerTrigger=100)
    assert sum(batches) == 450
    assert len(batches) >= 5 and max(batches) <= 100


def test_max_bytes_per_trigger_splits_batches(spark, store, store_uri, source, tmp_path):
    written = fill(store, source, 200)
    total = sum(len(w.payload) for w in written)
    batches = stream_batches(
        spark, store_uri, source, tmp_path / "ck", maxBytesPerTrigger=total // 4
    )
    assert sum(batches) == 200 and len(batches) >= 4


def test_available_now_stops_at_the_tail_it_saw_and_a_restart_resumes(
    spark, store, store_uri, source, tmp_path
):
    fill(store, source, 150)
    seen: list[int] = []

    def on_batch(batch, batch_id):
        seen.append(batch.count())
        if batch_id == 0:
            fill(store, source, 70, first=150)  # arrives after AvailableNow fixed its end

    query = (
        spark.readStream.format("sluice")
        .option("store", store_uri)
        .option("stream", source)
        .option("maxEventsPerTrigger", "50")
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=300)
    assert not query.isActive
    assert sum(seen) == 150

    seen.clear()
    query = (
        spark.readStream.format("sluice")
        .option("store", store_uri)
        .option("stream", source)
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=300)
    assert sum(seen) == 70  # resumed after the 150, nothing read twice


def test_starting_at_tail_or_at_a_cut(spark, store, store_uri, source, tmp_path):
    fill(store, source, 40)
    middle = store.tail(source)
    fill(store, source, 25, first=40)
    at_cut = stream_batches(spark, store_uri, source, tmp_path / "a", startingCut=middle.text)
    assert sum(at_cut) == 25
    assert stream_batches(spark, store_uri, source, tmp_path / "b", startingCut="tail") == []


def test_bad_options_are_clear_errors(store, store_uri, source):
    with pytest.raises(OptionError, match=re.escape("option stream (missing)")):
        SourceOptions.parse({"store": store_uri})
    with pytest.raises(OptionError, match="positive whole number"):
        SourceOptions.parse({"stream": source, "maxEventsPerTrigger": "-3"})
    other = StreamCut.of("test", "other", {0: 0}).text
    from pipeline.spark.options import resolve_cut

    with pytest.raises(OptionError, match=re.escape("not of test/source")):
        resolve_cut(store, source, other, "startingCut")
    with pytest.raises(OptionError, match="head / tail"):
        resolve_cut(store, source, "yesterday", "startingCut")


def test_emit_ranges_gives_one_row_per_planned_range(spark, store, store_uri, source):
    for i in range(4):
        fill(store, source, 30, first=30 * i)
    rows = (
        spark.read.format("sluice")
        .option("store", store_uri)
        .option("stream", source)
        .option("emit", "ranges")
        .option("minPartitions", "4")
        .option("minSplitBytes", "256")
        .load()
        .collect()
    )
    assert rows and {r["store"] for r in rows} == {store_uri}
    covered = sum(
        len(list(store.read_segment(source, r["segment"], r["start"], r["end"]))) for r in rows
    )
    assert covered == 120


def test_a_range_read_as_arrow_holds_every_event_of_the_range(store, store_uri, source):
    """The executor's Arrow batches (built from the store's batch reads) against `read`:
    small and large payloads, an empty one, keys and none, a range starting inside a block."""
    with store.writer(source) as w:
        for i in range(60):
            size = 50_000 if i % 9 == 0 else i * 7
            w.write(bytes([i]) * size, routing_key=None if i % 5 == 0 else f"k{i % 3}")
            if i % 4 == 3:
                w.flush()
    segment = next(s for s, off in store.tail(source).positions if off > 0)
    events = list(store.read_segment(source, segment, 0))
    start, end = events[2].offset, events[-1].offset
    part = SegmentRange(store_uri, source, segment, start, end)
    table = pa.Table.from_batches(list(read_range(part)))
    expected = events[2:-1]
    assert table.column("payload").to_pylist() == [e.payload for e in expected]
    assert table.column("offset").to_pylist() == [e.offset for e in expected]
    assert table.column("end_offset").to_pylist() == [e.end_offset for e in expected]
    assert table.column("routing_key").to_pylist() == [e.routing_key for e in expected]
    assert table.column("segment").to_pylist() == [segment] * len(expected)
    ingest = table.column("ingest_time").cast(pa.int64()).to_pylist()
    assert ingest == [e.ingest_time_ns // 1000 for e in expected]


def whole_segment(store, store_uri, source) -> SegmentRange:
    segment = next(s for s, off in store.tail(source).positions if off > 0)
    return SegmentRange(store_uri, source, segment, 0, store.tail(source).offset(segment))


def test_arrow_batches_are_cut_where_the_next_run_does_not_fit_or_enough_events_are_in(
    store, store_uri, source, monkeypatch
):
    """A range's Arrow batches: runs of blocks are added whole while their payloads fit in
    `BATCH_BYTES` and fewer than `BATCH_EVENTS` events are in; a run larger than the bytes
    is a batch of its own. Every event is in one batch, in order."""
    from pipeline.spark import reading as spark_reading
    from pipeline.streams.embedded import reading as store_reading

    monkeypatch.setattr(store_reading, "RUN_BYTES", 16_384)  # a 24 KB block is a run
    monkeypatch.setattr(spark_reading, "BATCH_BYTES", 100_000)
    monkeypatch.setattr(spark_reading, "BATCH_EVENTS", 40)
    with store.writer(source) as w:
        for block in range(30):  # 30 runs of 4 events of 6,000 bytes
            for i in range(4):
                w.write(bytes([block, i]) * 3_000, routing_key="k")
            w.flush()
        w.write(b"L" * 300_000, routing_key="k")  # one run of one event: larger than a batch
        w.flush()
        for block in range(20):  # small blocks, read as one run of 200 events
            for i in range(10):
                w.write(b"%03d%03d...." % (block, i), routing_key="k")
            w.flush()

    part = whole_segment(store, store_uri, source)
    batches = list(read_range(part))

    events = list(store.read_segment(source, part.segment, 0))
    shapes = [(b.num_rows, len(b.column("payload").buffers()[2])) for b in batches]
    assert shapes == [(16, 96_000)] * 7 + [(8, 48_000), (1, 300_000), (200, 2_000)]
    table = pa.Table.from_batches(batches)
    assert table.column("payload").to_pylist() == [e.payload for e in events]
    assert table.column("offset").to_pylist() == [e.offset for e in events]


def test_a_range_read_into_arrow_lets_each_run_go_before_reading_the_next(
    store, store_uri, source, monkeypatch
):
    """Each run's payloads are copied into the Arrow batch at once, so the store reads every
    run of a range into one warm buffer: no new buffer (page faults on fresh memory) per run
    while a 32 MiB batch fills, which made a range read a tenth as fast as a plain file."""
    import mmap

    with store.writer(source) as w:
        for block in range(40):  # 40 runs of one 1 MiB block each, one Arrow batch
            for _ in range(16):
                w.write(bytes([block]) * 65_536, routing_key="k")
            w.flush()
    part = whole_segment(store, store_uri, source)
    made = []
    real = mmap.mmap
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: made.append(a) or real(*a, **k))

    batches = list(read_range(part))

    assert sum(b.num_rows for b in batches) == 640
    assert len(made) == 1, f"{len(made)} run buffers made for 40 runs"
