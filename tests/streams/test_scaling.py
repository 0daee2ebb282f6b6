"""Scaling embedded segments keeps per-key order for writers, transactions and readers."""

from __future__ import annotations

import pytest

from pipeline.streams import InvalidCut, ScalingPolicy


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
    with pytest.raises(InvalidCut, match="must exactly cover"):
        store.merge_segments("sc/b", [0, 2])
    with pytest.raises(InvalidCut, match="must exactly cover"):
        store.scale("sc/b", [0], [(0.0, 0.1)])
    store.split_segment("sc/b", 1)
    with pytest.raises(InvalidCut, match="not an active segment"):
        store.split_segment("sc/b", 1)
    assert len(store.info("sc/b").segments) == 5


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
