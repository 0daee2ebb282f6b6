"""Batch reads (`read_batches`, `read_segment_batches`): the same events as `read`, checked the
same way, their payloads slices of reused run buffers, and a damaged block stops the read
where `read` stops."""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import pytest

from pipeline.streams import Event, EventBatch, StreamCut
from pipeline.streams.embedded import reading
from pipeline.streams.errors import Corrupted

STREAM = "batch/s"


def as_tuples(events) -> list[tuple]:
    return [(e.segment, e.offset, e.end_offset, e.routing_key, e.payload) for e in events]


def batch_events(batches) -> list[Event]:
    return [e for b in batches for e in b.events()]


@pytest.fixture
def small_runs(monkeypatch):
    """Runs of at most 4 KiB: a range of many runs."""
    monkeypatch.setattr(reading, "RUN_BYTES", 4096)


def fill(store) -> None:
    """Two segments: blocks of many small events, blocks of one large event, mixed keys."""
    store.create_stream(STREAM, segments=2)
    rng = random.Random(3)
    with store.writer(STREAM) as w:
        for b in range(40):
            for i in range(rng.choice([1, 4, 12])):
                size = 40_000 if b % 7 == 0 else rng.randrange(0, 900)
                w.write(rng.randbytes(size), routing_key=f"k{(b + i) % 5}")
            w.flush()


@pytest.mark.parametrize("runs", ["default", "small"])
def test_batches_hold_exactly_the_events_of_read(store, request, runs: str):
    if runs == "small":
        request.getfixturevalue("small_runs")
    fill(store)
    events = list(store.read(STREAM))
    batches = list(store.read_batches(STREAM))
    assert as_tuples(batch_events(batches)) == as_tuples(events)
    assert all(isinstance(b, EventBatch) and len(b) for b in batches)
    assert {b.segment for b in batches} == {0, 1}
    assert sum(b.nbytes for b in batches) == sum(len(e.payload) for e in events)
    for batch in batches:
        for i in range(len(batch)):
            assert bytes(batch.payload(i)) == batch.data[batch.starts[i] : batch.ends[i]]


def test_batches_between_cuts_inside_blocks(store, small_runs):
    fill(store)
    events = list(store.read(STREAM))
    seg0 = [e for e in events if e.segment == 0]
    seg1 = [e for e in events if e.segment == 1]
    start = StreamCut.of("batch", "s", {0: seg0[3].offset, 1: seg1[5].offset})
    end = StreamCut.of("batch", "s", {0: seg0[-4].end_offset, 1: seg1[-2].offset})
    expected = as_tuples(store.read(STREAM, start, end))
    assert expected == as_tuples(seg0[3:-3] + seg1[5:-2])
    assert as_tuples(batch_events(store.read_batches(STREAM, start, end))) == expected
    got = store.read_segment_batches(STREAM, 1, seg1[5].offset, seg1[-2].offset)
    assert as_tuples(batch_events(got)) == as_tuples(seg1[5:-2])


def test_a_kept_batch_is_never_overwritten(store, small_runs):
    """Buffers are reused only once nothing refers to them: keeping every batch (or only a
    payload view) keeps its bytes."""
    fill(store)
    expected = [e.payload for e in store.read(STREAM)]
    kept = list(store.read_batches(STREAM))
    views = [b.payload(i) for b in store.read_batches(STREAM) for i in range(len(b))]
    list(store.read_batches(STREAM))  # more reads through the same kind of buffers
    assert [bytes(b.payload(i)) for b in kept for i in range(len(b))] == expected
    assert [bytes(v) for v in views] == expected
    with pytest.raises(TypeError):
        kept[0].data[0] = 1  # read-only: a batch cannot change what others read


def damage_block(store, store_dir: Path, segment: int, nth: int) -> tuple[int, list[Event]]:
    """Flip a byte inside the `nth` block of a segment; its offset and the events before it."""
    engine = store._engine
    row = engine.stream_row(STREAM)
    blocks = engine.blocks(row, segment, 0, 2**63 - 1)
    bad = blocks[nth]
    before = [e for e in store.read_segment(STREAM, segment, 0) if e.end_offset <= bad.offset]
    path = next((store_dir / "data").rglob(f"{segment}.seg"))
    with path.open("r+b") as fh:
        fh.seek(bad.end - 3)
        byte = fh.read(1)
        fh.seek(bad.end - 3)
        fh.write(bytes([byte[0] ^ 0x10]))
    return bad.offset, before


@pytest.mark.parametrize("api", ["events", "batches"])
@pytest.mark.parametrize("nth", [0, 5, 17])
def test_a_damaged_block_stops_the_read_after_the_blocks_before_it(
    store, store_dir, small_runs, api: str, nth: int
):
    store.create_stream(STREAM)
    with store.writer(STREAM) as w:
        for b in range(30):
            for i in range(1 + b % 3):
                w.write(os.urandom(700 + 50 * i), routing_key="k")
            w.flush()
    offset, before = damage_block(store, store_dir, 0, nth)
    got: list[Event] = []
    message = f"stream batch/s segment 0 is damaged at offset {offset}"
    with pytest.raises(Corrupted, match=re.escape(message)):
        if api == "events":
            got.extend(store.read(STREAM))
        else:
            for batch in store.read_batches(STREAM):
                got.extend(batch.events())
    assert as_tuples(got) == as_tuples(before)


def test_an_error_reading_a_later_run_is_raised_by_the_reader(store, small_runs, monkeypatch):
    fill(store)
    real = reading.check_run
    calls = {"n": 0}

    def failing(reader, rows):
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(5, "I/O error")
        return real(reader, rows)

    monkeypatch.setattr(reading, "check_run", failing)
    with pytest.raises(OSError, match="I/O error"):
        list(store.read_segment_batches(STREAM, 0, 0))


def test_event_batch_of_events_read_one_by_one():
    events = [
        Event("a/b", 2, 0, 10, "k", b"one", 5),
        Event("a/b", 2, 10, 30, None, b"", 6),
        Event("a/b", 2, 30, 44, "k", b"three", 7),
    ]
    batch = EventBatch.of("a/b", 2, events)
    assert list(batch.events()) == events
    assert batch.nbytes == 8 and len(batch) == 3
    assert bytes(batch.payload(2)) == b"three"
