"""Scaling embedded segments keeps per-key order for writers, transactions and readers."""

from __future__ import annotations

import math
import re

import pytest

from pipeline.streams import (
    InvalidArgument,
    ScalingPolicy,
    SegmentNotActive,
    StreamSealed,
)


def keyed(events):
    by_key: dict[str, list[int]] = {}
    for e in events:
        key, seq = e.payload.decode().split(":")
        by_key.setdefault(key, []).append(int(seq))
    return by_key


def write(store, stream, seqs, keys=10):
    with store.writer(stream) as w:
        for i in seqs:
            w.write(f"k{i % keys}:{i}".encode(), routing_key=f"k{i % keys}")


def assert_ordered(events, total, keys=10):
    by_key = keyed(events)
    assert sorted(s for seqs in by_key.values() for s in seqs) == list(range(total))
    assert all(seqs == sorted(seqs) for seqs in by_key.values()), "per-key order broken"


def test_split_then_merge_keeps_key_order(store):
    store.create_stream("sc/s", segments=1)
    write(store, "sc/s", range(50))
    old_tail = store.tail("sc/s")
    assert store.split_segment("sc/s", 0, parts=2) == [1, 2]
    write(store, "sc/s", range(50, 100))
    info = store.info("sc/s")
    assert [s.sealed for s in info.segments] == [True, False, False]
    assert info.segments[1].events + info.segments[2].events == 50
    assert_ordered(list(store.read("sc/s")), 100)
    after = list(store.read("sc/s", old_tail))  # a cut from before the scale
    assert sorted(int(e.payload.split(b":")[1]) for e in after) == list(range(50, 100))
    assert store.merge_segments("sc/s", [1, 2]) == 3
    write(store, "sc/s", range(100, 150))
    assert_ordered(list(store.read("sc/s")), 150)


def test_writer_and_transaction_opened_before_a_split(store):
    store.create_stream("sc/w", segments=1)
    writer = store.writer("sc/w")
    txn = store.begin_transaction("sc/w")
    for i in range(20):
        writer.write(f"k{i % 4}:{i}".encode(), routing_key=f"k{i % 4}")
    writer.flush()
    for i in range(20, 40):
        txn.write(f"k{i % 4}:{i}".encode(), routing_key=f"k{i % 4}")
    txn.flush()  # flushed into the segment that is about to be sealed
    for i in range(40, 60):
        writer.write(f"k{i % 4}:{i}".encode(), routing_key=f"k{i % 4}")
    store.split_segment("sc/w", 0, parts=2)
    writer.flush()  # its segment was sealed under it: the events move to the successors
    txn.commit()  # rebased onto the successors
    events = list(store.read("sc/w"))
    assert [e.segment for e in events[:20]] == [0] * 20
    assert {e.segment for e in events[20:]} <= {1, 2}
    by_key = keyed(events)
    assert sorted(s for v in by_key.values() for s in v) == list(range(60))
    for seqs in by_key.values():  # each writer's (and the transaction's) events in order
        from_writer = [s for s in seqs if not 20 <= s < 40]
        from_txn = [s for s in seqs if 20 <= s < 40]
        assert from_writer == sorted(from_writer)
        assert from_txn == sorted(from_txn)


def test_reader_group_reads_predecessors_first(store):
    store.create_stream("sc/r", segments=2)
    write(store, "sc/r", range(40))
    reader = store.reader_group("g", "sc/r").reader("r1")
    first = reader.read(15)
    reader.commit()
    store.split_segment("sc/r", 0)
    store.split_segment("sc/r", 1)
    write(store, "sc/r", range(40, 100))
    seen = list(first)
    while batch := reader.read(7):
        seen += batch
        reader.commit()
    assert_ordered(seen, 100)
    reader.close()


def test_bad_scales_are_refused(store):
    store.create_stream("sc/b", segments=3)
    gap = "invalid segments to merge [0, 2]: only neighbours merge, and their key ranges"
    with pytest.raises(InvalidArgument, match=re.escape(gap)):
        store.merge_segments("sc/b", [0, 2])
    with pytest.raises(InvalidArgument, match="they must exactly cover"):
        store.scale("sc/b", [0], [(0.0, 0.1)])
    store.split_segment("sc/b", 1)
    sealed = "stream sc/b has no active segment 1: its active segments are 0, 2, 3, 4"
    with pytest.raises(SegmentNotActive, match=re.escape(sealed)):
        store.split_segment("sc/b", 1)
    with pytest.raises(SegmentNotActive, match=re.escape(sealed)):
        store.scale("sc/b", [1], [(1 / 3, 2 / 3)])
    assert len(store.info("sc/b").segments) == 5
    store.seal_stream("sc/b")
    with pytest.raises(StreamSealed):
        store.split_segment("sc/b", 0)


ACTIVE = "its active segments are 0, 1 (`sluice store info sc/args` lists them)"


@pytest.mark.parametrize(
    ("scale", "error", "message"),
    [
        (
            lambda s: s.split_segment("sc/args", 0, parts=0),
            InvalidArgument,
            "invalid number of parts 0: a split makes 2 or more segments",
        ),
        (
            lambda s: s.split_segment("sc/args", 0, parts=1),
            InvalidArgument,
            "invalid number of parts 1: a split makes 2 or more segments",
        ),
        (
            lambda s: s.split_segment("sc/args", 0, parts=-1),
            InvalidArgument,
            "invalid number of parts -1: a split makes 2 or more segments",
        ),
        (
            lambda s: s.split_segment("sc/args", 99),
            SegmentNotActive,
            f"stream sc/args has no active segment 99: {ACTIVE}",
        ),
        (
            lambda s: s.merge_segments("sc/args", [1]),
            InvalidArgument,
            "invalid segments to merge [1]: a merge takes 2 or more neighbouring segments",
        ),
        (
            lambda s: s.merge_segments("sc/args", [1, 1]),
            InvalidArgument,
            "invalid segments to merge [1, 1]: a merge takes 2 or more neighbouring segments",
        ),
        (
            lambda s: s.merge_segments("sc/args", [1, 8]),
            SegmentNotActive,
            f"stream sc/args has no active segment 8: {ACTIVE}",
        ),
        (
            lambda s: s.auto_scale("sc/args", ScalingPolicy("events_per_second", 1.0), 0),
            InvalidArgument,
            "invalid scaling window 0: a number of seconds above 0",
        ),
        (
            lambda s: s.auto_scale("sc/args", ScalingPolicy("events_per_second", 1.0), -60),
            InvalidArgument,
            "invalid scaling window -60: a number of seconds above 0",
        ),
    ],
    ids=[
        "parts-0",
        "parts-1",
        "parts-negative",
        "split-unknown",
        "merge-one",
        "merge-one-twice",
        "merge-unknown",
        "window-0",
        "window-negative",
    ],
)
def test_bad_scale_arguments_are_typed_errors_that_change_nothing(store, scale, error, message):
    store.create_stream("sc/args", segments=2)
    write(store, "sc/args", range(20))
    before = store.info("sc/args")
    with pytest.raises(error, match=re.escape(message)):
        scale(store)
    assert store.info("sc/args") == before


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"target": -1}, "invalid scaling target -1: a rate above 0 per second"),
        ({"target": 0}, "invalid scaling target 0: a rate above 0 per second"),
        ({"target": math.nan}, "invalid scaling target nan: a rate above 0 per second"),
        ({"kind": "bogus"}, "invalid scaling kind 'bogus': events_per_second or kbytes_per_second"),
        ({"scale_factor": 1}, "invalid scale_factor 1: a split makes 2 or more segments"),
        ({"min_segments": 0}, "invalid min_segments 0: a stream keeps 1 or more segments"),
    ],
)
def test_a_scaling_policy_that_cannot_work_is_refused(fields, message):
    policy = {"kind": "events_per_second", "target": 5.0, **fields}
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        ScalingPolicy(**policy)


def test_auto_scale_by_event_rate(store):
    store.create_stream("sc/hot", segments=1)
    write(store, "sc/hot", range(600), keys=50)
    policy = ScalingPolicy("events_per_second", target=5.0, scale_factor=2)
    assert store.auto_scale("sc/hot", policy, window_seconds=60) == [1, 2]
    store.create_stream("sc/cold", segments=4)
    cold = ScalingPolicy("events_per_second", target=5.0, min_segments=2)
    assert store.auto_scale("sc/cold", cold) == [4]
    assert store.auto_scale("sc/cold", cold) == [5]
    assert store.auto_scale("sc/cold", cold) == []  # min_segments reached
