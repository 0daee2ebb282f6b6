"""Retention on the embedded store beside live writers, readers and transactions, as
`sluice store retain` applies it from a timer: what it keeps, and what a reader behind it sees."""

from __future__ import annotations

import multiprocessing as mp
import re
import time

import pytest

from pipeline.streams import InvalidArgument, Retention, StreamCut, Truncated, open_store

HOUR = 3600.0


def payloads(events) -> list[bytes]:
    return [e.payload for e in events]


def test_a_head_inside_a_block_keeps_the_young_events_after_it(store):
    store.create_stream("ret/mid", retention=Retention(max_age_seconds=HOUR))
    with store.writer("ret/mid") as w:  # one block of five events
        for i in range(5):
            w.write(f"e{i}".encode())
    third = list(store.read("ret/mid"))[2]
    store.truncate(StreamCut.of("ret", "mid", {0: third.offset}))
    assert store.apply_retention("ret/mid") is None, "every event is younger than an hour"
    assert payloads(store.read("ret/mid")) == [b"e2", b"e3", b"e4"]
    store.apply_retention("ret/mid", now_ns=time.time_ns() + int(2 * HOUR * 1e9))
    assert payloads(store.read("ret/mid")) == []


BYTES_RULE = "keep a positive whole number of bytes, or set no byte limit"
SECONDS_RULE = "keep events for a positive number of seconds, or set no age limit"


@pytest.mark.parametrize(
    ("retention", "message"),
    [
        (Retention(max_bytes=-5), f"invalid retention max_bytes -5: {BYTES_RULE}"),
        (Retention(max_bytes=0), f"invalid retention max_bytes 0: {BYTES_RULE}"),
        (Retention(max_bytes=1.5), f"invalid retention max_bytes 1.5: {BYTES_RULE}"),
        (Retention(max_age_seconds=-1), f"invalid retention max_age_seconds -1: {SECONDS_RULE}"),
        (Retention(max_age_seconds=0.0), f"invalid retention max_age_seconds 0.0: {SECONDS_RULE}"),
    ],
)
def test_a_retention_that_would_keep_nothing_is_refused_and_nothing_is_created(
    store, retention, message
):
    store.create_stream("ret/kept")
    with store.writer("ret/kept") as w:
        w.write(b"e0")
    before = store.info("ret/kept")
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        store.create_stream("other/bad", retention=retention)
    assert (store.list_scopes(), store.list_streams()) == (["ret"], ["ret/kept"])
    assert store.info("ret/kept") == before


def test_a_policy_recorded_before_it_was_checked_is_never_applied(store):
    """A stream created before `create_stream` refused such a policy keeps its events: retain
    refuses the policy (`sluice store retain` says so and goes on with the other streams)."""
    store.create_stream("ret/old", retention=Retention(max_bytes=10))
    with store.writer("ret/old") as w:
        w.write(b"e0" * 100)
    with store._engine.catalog.write() as db:  # as an earlier Sluice recorded it
        db.execute("UPDATE streams SET retention_bytes=-5 WHERE name='old'")
    before = store.info("ret/old")
    with pytest.raises(InvalidArgument, match=re.escape(f"max_bytes -5: {BYTES_RULE}")):
        store.apply_retention("ret/old")
    assert store.info("ret/old") == before


def test_a_read_overtaken_by_retention_raises_truncated(store):
    store.create_stream("ret/read", retention=Retention(max_age_seconds=HOUR))
    for i in range(128):  # 16 MiB in 128 blocks: more than a read buffers ahead
        with store.writer("ret/read") as w:
            w.write(bytes([i]) * 128 * 1024)
    events = store.read("ret/read")
    assert next(events).payload[0] == 0
    young = time.time_ns()
    with store.writer("ret/read") as w:
        w.write(b"young")
    cut = store.apply_retention("ret/read", now_ns=young + int(HOUR * 1e9) - 1)
    assert cut == store.head("ret/read")
    with pytest.raises(Truncated, match=re.escape("start from the head cut instead")):
        for event in events:
            assert event.payload != b"young"
    assert payloads(store.read("ret/read")) == [b"young"]


def test_a_reader_group_behind_the_head_gets_truncated_until_it_is_reset(store):
    store.create_stream("ret/group", retention=Retention(max_age_seconds=HOUR))
    with store.writer("ret/group") as w:
        w.write(b"old")
    group = store.reader_group("slow", "ret/group")
    boundary = time.time_ns()
    with store.writer("ret/group") as w:
        w.write(b"new")
    assert store.apply_retention("ret/group", now_ns=boundary + int(HOUR * 1e9)) is not None
    reader = group.reader("r1")
    with pytest.raises(Truncated, match="ret/group segment 0 was truncated"):
        reader.read(10)
    reader.close()
    group.reset(store.head("ret/group"))
    reader = group.reader("r1")
    assert payloads(reader.read(10)) == [b"new"]


def test_an_open_transaction_commits_after_retention(store):
    store.create_stream("ret/txn", retention=Retention(max_age_seconds=HOUR))
    with store.writer("ret/txn") as w:
        w.write(b"old")
    txn = store.begin_transaction("ret/txn")
    txn.write(b"in the transaction")
    txn.flush()
    store.apply_retention("ret/txn", now_ns=time.time_ns() + int(2 * HOUR * 1e9))
    assert payloads(store.read("ret/txn")) == []
    txn.commit()
    assert payloads(store.read("ret/txn")) == [b"in the transaction"]


def _write_numbered(store_dir: str, count: int) -> None:
    with open_store(f"embedded:{store_dir}") as store, store.writer("ret/live") as w:
        for i in range(count):
            w.write(f"{i}".encode(), routing_key=f"k{i % 3}")
            w.flush()


def test_retention_beside_a_writer_keeps_a_gapless_suffix(store, store_dir):
    store.create_stream("ret/live", segments=2, retention=Retention(max_bytes=2000))
    count = 150
    writer = mp.get_context("fork").Process(target=_write_numbered, args=(str(store_dir), count))
    writer.start()
    cuts = 0
    while writer.is_alive():
        cuts += store.apply_retention("ret/live") is not None
    writer.join()
    assert writer.exitcode == 0
    cuts += store.apply_retention("ret/live") is not None
    assert cuts > 1, "retention ran while the writer wrote"
    by_key: dict[str, list[int]] = {}
    for event in store.read("ret/live"):
        by_key.setdefault(event.routing_key, []).append(int(event.payload))
    for key, numbers in by_key.items():
        first = numbers[0]
        assert numbers == list(range(first, count, 3)), f"{key}: a gap or a reordering"
    assert 0 < sum(map(len, by_key.values())) < count
