"""The two-phase commit against the real embedded store, step by step."""

from __future__ import annotations

import pytest

from collectors.buffer import Buffer
from collectors.coordinator import TransactionCoordinator
from collectors.failpoints import Failpoints
from collectors.state import PendingEvent
from pipeline.streams import open_store

STREAM = "site/samples"


@pytest.fixture
def instance(make_config):
    config = make_config({"c": {"driver": "generator", "stream": STREAM, "max_events_per_txn": 3}})
    return config.instances[0]


@pytest.fixture
def parts(instance, store):
    store.create_stream(STREAM)
    buffer = Buffer(instance.buffer_file, instance.capacity_events)
    return TransactionCoordinator(store, buffer, instance, Failpoints()), buffer


def fill(buffer: Buffer, n: int, start: int = 0) -> None:
    buffer.append(
        [PendingEvent(f"e{i}".encode(), "k", 100 + i, 200 + i, 1) for i in range(start, start + n)]
    )


def flushed_ready(store, buffer: Buffer, n: int):
    """Steps 1-3 of the protocol for the next `n` events; return the stream txn and record."""
    batch = buffer.next_batch(n, 1 << 20)
    txn = store.begin_transaction(STREAM)
    buffer.record_open(txn.txn_id, STREAM)
    for event in batch:
        txn.write(event.payload, event.routing_key)
    txn.flush()
    return txn, buffer.mark_ready(txn.txn_id, STREAM, batch)


def payloads(store) -> list[bytes]:
    return [e.payload for e in store.read(STREAM)]


def test_batches_arrive_in_order_with_their_time_bounds(parts, store):
    coordinator, buffer = parts
    fill(buffer, 7)
    assert [coordinator.send_batch() for _ in range(4)] == [3, 3, 1, 0]
    assert payloads(store) == [f"e{i}".encode() for i in range(7)]
    assert buffer.depth() == 0 and buffer.txns() == []
    start, end = store.time_cuts(STREAM, 100, 103)  # samples of the first transaction only
    assert [e.payload for e in store.read(STREAM, start, end)] == [b"e0", b"e1", b"e2"]


def test_a_ready_transaction_is_committed_again_after_a_crash(parts, store, instance):
    _, buffer = parts
    fill(buffer, 3)
    flushed_ready(store, buffer, 3)
    # the process dies here; a new one opens the same buffer and store
    with open_store(store.uri) as store2:
        again = TransactionCoordinator(
            store2, Buffer(instance.buffer_file, 10), instance, Failpoints()
        )
        assert again.recover() == 1
        assert again.recover() == 0
        assert again.send_batch() == 0  # the batch is not sent a second time
    assert payloads(store) == [b"e0", b"e1", b"e2"]
    assert buffer.counters()["txns_recommitted"] == 1


def test_recommitting_a_committed_transaction_is_a_no_op(parts, store):
    coordinator, buffer = parts
    fill(buffer, 2)
    txn, record = flushed_ready(store, buffer, 3)
    txn.commit(record.time_bounds)  # ... and the crash comes before forget
    assert coordinator.recover() == 1
    assert payloads(store) == [b"e0", b"e1"]
    assert buffer.depth() == 0


def test_an_open_transaction_is_aborted_and_its_batch_sent_again(parts, store):
    coordinator, buffer = parts
    fill(buffer, 2)
    txn = store.begin_transaction(STREAM)
    buffer.record_open(txn.txn_id, STREAM)
    txn.write(b"e0")
    txn.flush()  # flushed but never recorded ready: the crash came first
    assert coordinator.recover() == 1
    assert store.get_transaction(STREAM, txn.txn_id).state() == "aborted"
    assert coordinator.send_batch() == 2
    assert payloads(store) == [b"e0", b"e1"]


def test_a_transaction_the_store_aborted_is_requeued_not_lost(parts, store):
    coordinator, buffer = parts
    fill(buffer, 4)
    txn, _ = flushed_ready(store, buffer, 2)
    txn.abort()  # e.g. its lease ran out during a long outage
    assert coordinator.recover() == 1
    while coordinator.send_batch():
        pass
    assert payloads(store) == [b"e0", b"e1", b"e2", b"e3"]
    assert buffer.counters()["txns_requeued"] == 1


def test_an_unknown_transaction_is_kept_as_doubtful_and_reported(parts, store, tmp_path):
    coordinator, buffer = parts
    fill(buffer, 3)
    other = open_store(f"embedded:{tmp_path / 'elsewhere'}")
    other.create_stream(STREAM)
    foreign = other.begin_transaction(STREAM)  # an id this store never saw
    buffer.record_open(foreign.txn_id, STREAM)
    buffer.mark_ready(foreign.txn_id, STREAM, buffer.next_batch(2, 1 << 20))
    coordinator.recover()
    (record,) = buffer.txns()
    assert record.state == "doubtful" and "may or may not be in site/samples" in record.note
    assert buffer.depth() == 3  # its rows are kept
    assert coordinator.send_batch() == 1  # later events still flow
    assert payloads(store) == [b"e2"]
    assert buffer.counters()["errors"] == 1


def test_a_failed_write_aborts_the_transaction_and_keeps_the_batch(parts, store, instance):
    coordinator, buffer = parts
    fill(buffer, 2)
    store.seal_stream(STREAM)
    with pytest.raises(Exception, match="sealed"):
        coordinator.send_batch()
    assert buffer.depth() == 2
    assert all(r.state == "open" for r in buffer.txns())  # recovery will clear it
    assert buffer.next_batch(10, 1 << 20)[0].payload == b"e0"


def test_time_bounds_follow_the_samples(parts, store, instance):
    coordinator, buffer = parts
    buffer.append(
        [PendingEvent(b"a", "k", 5_000, 9_000, 4), PendingEvent(b"b", "k", 1_000, 2_000, 4)]
    )
    coordinator.send_batch()
    start, end = store.time_cuts(STREAM, 1_000, 1_001)
    assert [e.payload for e in store.read(STREAM, start, end)] == [b"a", b"b"]
    start, end = store.time_cuts(STREAM, 10_000, 20_000)
    assert list(store.read(STREAM, start, end)) == []
