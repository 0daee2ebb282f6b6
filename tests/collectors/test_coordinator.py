"""The two-phase commit against the real embedded store, step by step, in both protocols."""

from __future__ import annotations

import dataclasses
import re

import pytest

from collectors.buffer import Buffer
from collectors.buffer.schema import PendingEvent
from collectors.coordinator import TransactionCoordinator
from collectors.errors import ConfigError
from pipeline.failpoints import Failpoints
from pipeline.streams import Transaction, TxnState, Unsupported, open_store
from pipeline.streams.embedded import EmbeddedStore

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
    buffer.ledger.record_open(txn.txn_id, STREAM)
    for event in batch:
        txn.write(event.payload, event.routing_key)
    txn.flush()
    return txn, buffer.ledger.mark_ready(txn.txn_id, STREAM, batch)


def unknown_txn_id(tmp_path) -> str:
    """A real transaction id that the test's store never saw (begun in another store)."""
    with open_store(f"embedded:{tmp_path / 'elsewhere'}") as other:
        other.create_stream(STREAM)
        return other.begin_transaction(STREAM).txn_id


def payloads(store) -> list[bytes]:
    return [e.payload for e in store.read(STREAM)]


def test_batches_arrive_in_order_with_their_time_bounds(parts, store):
    coordinator, buffer = parts
    fill(buffer, 7)
    assert [coordinator.send_batch() for _ in range(4)] == [3, 3, 1, 0]
    assert payloads(store) == [f"e{i}".encode() for i in range(7)]
    assert buffer.depth() == 0 and buffer.ledger.txns() == []
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
    buffer.ledger.record_open(txn.txn_id, STREAM)
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
    foreign = unknown_txn_id(tmp_path)
    buffer.ledger.record_open(foreign, STREAM)
    buffer.ledger.mark_ready(foreign, STREAM, buffer.next_batch(2, 1 << 20))
    coordinator.recover()
    (record,) = buffer.ledger.txns()
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
    assert all(r.state == "open" for r in buffer.ledger.txns())  # recovery will clear it
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


# --- the commit protocol (stores that cannot flush a transaction) -------------------------


@pytest.fixture
def committing(make_config, store):
    """A coordinator running the commit protocol against the embedded store, and its buffer."""
    config = make_config(
        {
            "c": {
                "driver": "generator",
                "stream": STREAM,
                "max_events_per_txn": 3,
                "txn_protocol": "commit",
            }
        }
    )
    instance = config.instances[0]
    store.create_stream(STREAM)
    buffer = Buffer(instance.buffer_file, instance.capacity_events)
    coordinator = TransactionCoordinator(store, buffer, instance, Failpoints())
    assert coordinator.protocol == "commit"
    return coordinator, buffer


def recorded_open(store, buffer: Buffer, n: int):
    """Step 1 of the commit protocol and the writes of step 2 for the next `n` events (the
    commit is the test's to do, or not); return the stream txn and its record."""
    batch = buffer.next_batch(n, 1 << 20)
    txn = store.begin_transaction(STREAM)
    record = buffer.ledger.record_open(txn.txn_id, STREAM, batch=batch)
    for event in batch:
        txn.write(event.payload, event.routing_key)
    return txn, record


def restarted(coordinator: TransactionCoordinator, store) -> TransactionCoordinator:
    """A new coordinator on the same buffer file and store, as after a process restart."""
    settings = coordinator.settings
    buffer = Buffer(settings.buffer_file, settings.capacity_events)
    return TransactionCoordinator(store, buffer, settings, Failpoints())


def drain(coordinator: TransactionCoordinator) -> None:
    coordinator.recover()
    while coordinator.send_batch():
        coordinator.recover()


def test_commit_protocol_sends_every_batch_once_in_order(committing, store):
    coordinator, buffer = committing
    fill(buffer, 7)
    assert coordinator.send_batch() == 3
    (held,) = buffer.ledger.txns()  # committed, forgotten with the next batch's record
    assert (held.state, held.first_id, held.last_id, held.events) == ("open", 1, 3, 3)
    fresh = Buffer(buffer.path, 10)  # as a restart (or `sluice collect status`) reads it
    assert buffer.queued() == fresh.queued() == 4  # its rows are held out of the queue
    assert [coordinator.send_batch() for _ in range(3)] == [3, 1, 0]
    assert payloads(store) == [f"e{i}".encode() for i in range(7)]
    assert buffer.depth() == 0 and buffer.ledger.txns() == []
    assert buffer.counters()["txns_committed"] == 3
    start, end = store.time_cuts(STREAM, 100, 103)  # samples of the first transaction only
    assert [e.payload for e in store.read(STREAM, start, end)] == [b"e0", b"e1", b"e2"]


def test_commit_protocol_a_committed_transaction_is_forgotten_not_resent(committing, store):
    coordinator, buffer = committing
    fill(buffer, 5)
    txn, record = recorded_open(store, buffer, 3)
    txn.commit(record.time_bounds)  # ... and the process dies before it forgets
    again = restarted(coordinator, store)
    assert again.recover() == 1
    assert again.recover() == 0
    drain(again)
    assert payloads(store) == [b"e0", b"e1", b"e2", b"e3", b"e4"]
    assert buffer.counters()["txns_recommitted"] == 1
    assert buffer.depth() == 0 and buffer.ledger.txns() == []


class CrashMidCommit(Exception):
    """Stands for a SIGKILL after the block of a one-segment commit landed, before the store
    recorded it committed (the block is the commit: the store finds it committed)."""


def test_commit_protocol_a_commit_cut_short_is_finished(committing, store, monkeypatch):
    from pipeline.streams.embedded.transactions import EmbeddedTransaction

    coordinator, buffer = committing
    fill(buffer, 4)

    def crash(self, segment, header):
        raise CrashMidCommit

    with monkeypatch.context() as patch:
        patch.setattr(EmbeddedTransaction, "_mark_landed", crash)
        with pytest.raises(CrashMidCommit):
            coordinator.send_batch()
    (record,) = buffer.ledger.txns()
    assert store.get_transaction(STREAM, record.txn_id).state() == "committed"
    again = restarted(coordinator, store)
    assert again.recover() == 1
    assert store.get_transaction(STREAM, record.txn_id).state() == "committed"
    drain(again)
    assert payloads(store) == [b"e0", b"e1", b"e2", b"e3"]
    assert buffer.counters()["txns_recommitted"] == 1


def test_commit_protocol_an_open_transaction_is_aborted_and_its_batch_resent(committing, store):
    coordinator, buffer = committing
    fill(buffer, 5)
    txn, _ = recorded_open(store, buffer, 3)  # written, never committed: the crash came first
    assert buffer.next_batch(10, 1 << 20)[0].payload == b"e3"  # held rows are not sent twice
    again = restarted(coordinator, store)
    assert again.recover() == 1
    assert store.get_transaction(STREAM, txn.txn_id).state() == "aborted"
    assert again.buffer.next_batch(10, 1 << 20)[0].payload == b"e0"  # back at the head
    drain(again)
    assert payloads(store) == [f"e{i}".encode() for i in range(5)]
    assert buffer.counters()["txns_aborted"] == 1


def test_commit_protocol_an_aborted_transaction_is_resent(committing, store):
    coordinator, buffer = committing
    fill(buffer, 4)
    txn, _ = recorded_open(store, buffer, 2)
    txn.abort()  # e.g. its lease ran out while the collector was down
    assert coordinator.recover() == 1
    assert buffer.ledger.txns() == []
    drain(coordinator)
    assert payloads(store) == [b"e0", b"e1", b"e2", b"e3"]


def test_commit_protocol_a_lease_lost_at_commit_sends_the_batch_again(committing, store):
    coordinator, buffer = committing
    fill(buffer, 2)
    short = dataclasses.replace(coordinator.settings, txn_lease_seconds=1e-6)
    hasty = TransactionCoordinator(store, buffer, short, Failpoints())
    assert hasty.send_batch() == 2  # the store aborts it at commit: its lease ran out
    assert payloads(store) == [] and buffer.ledger.txns() == []
    assert buffer.queued() == 2
    drain(coordinator)
    assert payloads(store) == [b"e0", b"e1"]


def test_commit_protocol_an_unknown_transaction_is_doubtful(committing, store, tmp_path):
    coordinator, buffer = committing
    fill(buffer, 3)
    buffer.ledger.record_open(unknown_txn_id(tmp_path), STREAM, batch=buffer.next_batch(2, 1 << 20))
    assert coordinator.recover() == 1
    (record,) = buffer.ledger.txns()
    assert record.state == "doubtful" and "may or may not be in site/samples" in record.note
    assert (record.first_id, record.last_id) == (1, 2)
    assert coordinator.recover() == 0  # reported once, never re-sent
    drain(coordinator)
    assert payloads(store) == [b"e2"]  # later events still flow
    assert [e.payload for e in buffer.next_batch(10, 1 << 20)] == []
    assert buffer.depth() == 2  # the doubtful rows are kept
    assert buffer.counters()["errors"] == 1


def test_recovery_follows_the_record_not_the_configured_protocol(parts, committing, store):
    flush_coordinator, buffer = parts
    commit_coordinator, _ = committing
    fill(buffer, 4)
    txn, record = recorded_open(store, buffer, 2)  # left by the commit protocol
    txn.commit(record.time_bounds)
    assert flush_coordinator.recover() == 1
    flushed_ready(store, buffer, 2)  # left by the flush protocol
    assert commit_coordinator.recover() == 1
    assert payloads(store) == [b"e0", b"e1", b"e2", b"e3"]
    assert buffer.depth() == 0 and buffer.counters()["txns_recommitted"] == 2


# --- choosing the protocol ---------------------------------------------------------------


class NoFlushTransaction(Transaction):
    """The Pravega adapter's contract on an embedded transaction: events become durable
    only inside `commit()`, so `flush()` is refused."""

    def __init__(self, inner: Transaction) -> None:
        self.inner, self.txn_id, self.stream = inner, inner.txn_id, inner.stream

    def write(self, payload: bytes, routing_key: str | None = None) -> None:
        self.inner.write(payload, routing_key)

    def flush(self) -> None:
        backend = "a store without txn_flush"
        raise Unsupported(backend, "flush a transaction", "commit it (that waits for the events)")

    def commit(self, time_bounds: tuple[int, int] | None = None) -> None:
        self.inner.commit(time_bounds)

    def abort(self) -> None:
        self.inner.abort()

    def state(self) -> TxnState:
        return self.inner.state()


class NoFlushStore(EmbeddedStore):
    features = EmbeddedStore.features - {"txn_flush"}

    def begin_transaction(self, stream: str, lease_seconds: float = 3600.0) -> Transaction:
        return NoFlushTransaction(super().begin_transaction(stream, lease_seconds))

    def get_transaction(self, stream: str, txn_id: str) -> Transaction:
        return NoFlushTransaction(super().get_transaction(stream, txn_id))


def test_auto_picks_the_commit_protocol_for_a_store_that_cannot_flush(instance, store_dir):
    assert instance.txn_protocol == "auto"
    with NoFlushStore(store_dir) as store:
        store.create_stream(STREAM)
        buffer = Buffer(instance.buffer_file, instance.capacity_events)
        coordinator = TransactionCoordinator(store, buffer, instance, Failpoints())
        assert coordinator.protocol == "commit"
        fill(buffer, 4)
        drain(coordinator)
        assert payloads(store) == [b"e0", b"e1", b"e2", b"e3"]
        flush = dataclasses.replace(instance, txn_protocol="flush")
        message = (
            f"collector config: instance c: txn_protocol = 'flush' needs a store that can "
            f'flush transactions, and {instance.store} cannot; set txn_protocol = "commit"'
        )
        with pytest.raises(ConfigError, match=re.escape(message)):
            TransactionCoordinator(store, buffer, flush, Failpoints())


def test_auto_picks_the_flush_protocol_for_the_embedded_store(parts):
    coordinator, _ = parts
    assert coordinator.protocol == "flush"


def test_a_bad_txn_protocol_is_one_clear_error(make_config):
    message = (
        "collector config: instance c (generator): instances.c.txn_protocol = 'fast' is not "
        "one of auto, flush, commit; auto picks flush where the store can flush transactions"
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_config({"c": {"driver": "generator", "stream": STREAM, "txn_protocol": "fast"}})
