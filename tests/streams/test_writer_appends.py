"""The embedded writer's append path: large payloads written without a copy, another store
handle (as another process) appending to or sealing the same segment, a torn tail left by a
crash, and a flush refused by a sealed or deleted stream."""

from __future__ import annotations

import os

import pytest

from pipeline.streams import StreamNotFound, StreamSealed, open_store

BIG = 64 * 1024


def segment_files(store_dir, stream_id: int = 1) -> list[str]:
    return sorted(p.name for p in (store_dir / "data" / str(stream_id)).glob("*.seg"))


def test_a_buffer_reused_after_write_changes_nothing_flushed(store):
    store.create_stream("w/reuse", segments=1)
    buffer = bytearray(os.urandom(BIG))
    first = bytes(buffer)
    with store.writer("w/reuse") as w:
        w.write(buffer, routing_key="k")
        buffer[:] = os.urandom(BIG)  # the caller reuses its buffer before the flush
        second = bytes(buffer)
        w.write(memoryview(buffer), routing_key="k")
        buffer[:] = bytes(BIG)
    assert [e.payload for e in store.read("w/reuse")] == [first, second]


def test_small_and_large_events_share_a_block(store):
    store.create_stream("w/mixed", segments=1)
    payloads = [os.urandom(n) for n in (0, 10, 4095, 4096, BIG, 3, 300_000, 1)]
    with store.writer("w/mixed") as w:
        for i, p in enumerate(payloads):
            w.write(p, routing_key=None if i % 3 == 0 else f"key-{i}")
    events = list(store.read("w/mixed"))
    assert [e.payload for e in events] == payloads
    assert store.info("w/mixed").segments[0].events == len(payloads)
    assert store.verify("w/mixed").ok


def test_appends_from_two_handles_interleave(store, store_dir):
    """Each handle finds the other's blocks past what it indexed itself and appends after
    them, never over them."""
    store.create_stream("w/two", segments=1)
    with open_store(f"embedded:{store_dir}") as other:
        mine, theirs = store.writer("w/two"), other.writer("w/two")
        for i in range(6):
            writer = mine if i % 2 == 0 else theirs
            for j in range(3):
                writer.write(f"{i}.{j}".encode() + bytes(BIG), routing_key="k")
            writer.flush()
    got = [e.payload[:3].decode() for e in store.read("w/two")]
    assert got == [f"{i}.{j}" for i in range(6) for j in range(3)]
    assert store.verify("w/two").ok


def test_a_torn_tail_is_cut_before_the_next_append(store, store_dir):
    store.create_stream("w/torn", segments=1)
    with store.writer("w/torn") as w:
        w.write(b"a" * BIG, routing_key="k")
        w.flush()
        segment = store_dir / "data" / "1" / "0.seg"
        end = segment.stat().st_size
        with segment.open("ab") as f:  # a crash mid-append left part of a block
            f.write(b"SLB1" + os.urandom(1000))
        w.write(b"b" * BIG, routing_key="k")
    assert [e.payload[:1] for e in store.read("w/torn")] == [b"a", b"b"]
    assert store.tail("w/torn").positions == ((0, segment.stat().st_size),)
    assert segment.stat().st_size == 2 * end  # two blocks of one size: the torn bytes are gone
    assert store.verify("w/torn").ok


def test_a_flush_refused_by_a_sealed_stream_keeps_its_events(store, store_dir):
    store.create_stream("w/sealed", segments=2)
    w = store.writer("w/sealed")
    w.write(b"first", routing_key="k")
    w.flush()
    w.write(b"late", routing_key="k")
    with open_store(f"embedded:{store_dir}") as other:
        other.seal_stream("w/sealed")
    with pytest.raises(StreamSealed):
        w.flush()
    with pytest.raises(StreamSealed):  # still pending: refused again, never dropped
        w.flush()
    assert [e.payload for e in store.read("w/sealed")] == [b"first"]


@pytest.mark.parametrize("flushed_before", [False, True])
def test_a_deleted_stream_gets_no_segment_file_back(store, store_dir, flushed_before):
    store.create_stream("w/gone", segments=1)
    w = store.writer("w/gone")
    if flushed_before:
        w.write(b"kept until deleted", routing_key="k")
        w.flush()
    with open_store(f"embedded:{store_dir}") as other:
        other.seal_stream("w/gone")
        other.delete_stream("w/gone")
    assert segment_files(store_dir) == []
    w.write(b"late", routing_key="k")
    with pytest.raises(StreamNotFound):
        w.flush()
    assert segment_files(store_dir) == []


def test_a_block_of_more_buffers_than_one_pwritev_takes(store):
    """Each large event is two buffers (its frame's head, its payload): a block of 1500 is
    written by several `pwritev` calls and still reads back whole."""
    store.create_stream("w/many", segments=1)
    payloads = [os.urandom(4096) for _ in range(1500)]
    with store.writer("w/many") as w:
        for p in payloads:
            w.write(p, routing_key="k")
    assert [e.payload for e in store.read("w/many")] == payloads
    assert store.info("w/many").segments[0].events == len(payloads)
    assert store.verify("w/many").ok
