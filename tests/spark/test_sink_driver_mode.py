"""`commitMode=driver`: the sink for stores that cannot flush a transaction (Pravega).

Tasks hand their rows over and the driver writes each batch into one transaction, recording
each attempt in the ledger; a re-run batch asks the store what became of the recorded
transaction. Run against the embedded store forced into this mode: the protocol is the same
whatever the store, and Pravega cannot run on this machine.
"""

from __future__ import annotations

import json

import pytest

from pipeline.spark.ledger import BatchLedger
from pipeline.spark.options import SinkOptions
from pipeline.spark.source import _sink
from pipeline.spark.writing import (
    HandoverMessage,
    UnknownBatchTransaction,
    _driver_plan,
    write_on_driver,
)
from pipeline.streams.embedded import EmbeddedStore
from tests.spark.conftest import fill, per_key_sequences
from tests.spark.test_sink import forget_commit, last_commit, payloads, start_copy

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("emit", ["events", "ranges"])
def test_a_copy_in_driver_mode_is_exact_ordered_and_one_transaction_per_batch(
    spark, store, source, tmp_path, emit
):
    for i in range(4):
        fill(store, source, 40, keys=5, first=40 * i)
    checkpoint = tmp_path / "ck"
    start_copy(
        spark, store.uri, source, "test/copy", checkpoint=checkpoint, emit=emit, commitMode="driver"
    )
    copied = list(store.read("test/copy"))
    assert sorted(e.payload for e in copied) == sorted(payloads(store, source))
    assert {(e.routing_key, e.payload) for e in copied} == {
        (e.routing_key, e.payload) for e in store.read(source)
    }
    for seqs in per_key_sequences([e.payload for e in copied]).values():
        assert seqs == sorted(seqs)
    with BatchLedger(checkpoint / "sluice-sink.sqlite") as ledger:
        batches = ledger.batches()
    assert {b.plan["kind"] for b in batches} == {"driver-txn"}
    assert all(b.state == "done" and b.stats["transactions"] <= 1 for b in batches)
    assert sum(b.stats["events"] for b in batches) == 160

    # The driver died after publishing batch N, before Spark logged it: the re-run is a no-op.
    forget_commit(checkpoint, last_commit(checkpoint))
    start_copy(
        spark, store.uri, source, "test/copy", checkpoint=checkpoint, emit=emit, commitMode="driver"
    )
    assert sorted(payloads(store, "test/copy")) == sorted(payloads(store, source))


def handed(*events: bytes, partition: int = 0, order=(0, 0)) -> HandoverMessage:
    return HandoverMessage(partition, order, (), tuple((e, "k") for e in events), (1, 2))


def batch_of(n: int, first: int = 0) -> list[bytes]:
    return [json.dumps({"seq": i}).encode() for i in range(first, first + n)]


@pytest.fixture
def sink(store, tmp_path) -> SinkOptions:
    store.create_stream("test/target")
    return SinkOptions(
        store=store.uri,
        stream="test/target",
        routing_key=None,
        state=str(tmp_path / "ledger.sqlite"),
        batch_id=None,
        create_segments=None,
        commit_mode="driver",
    )


def test_a_batch_whose_transaction_died_open_is_aborted_and_written_again(store, sink):
    events = batch_of(10)
    # The previous driver began batch 7's transaction, wrote part of it, and was killed.
    dead = store.begin_transaction(sink.stream)
    for payload in events[:4]:
        dead.write(payload, "k")
    with BatchLedger(sink.state) as ledger:
        ledger.attempt(7, _driver_plan(dead.txn_id, None))

    stats = write_on_driver(sink, [handed(*events)], 7)
    assert stats["events"] == 10
    assert payloads(store, sink.stream) == events
    assert store.get_transaction(sink.stream, dead.txn_id).state() == "aborted"
    with BatchLedger(sink.state) as ledger:
        assert ledger.get(7).state == "done"


def test_a_batch_whose_transaction_was_committed_is_only_marked_done(store, sink):
    events = batch_of(5)
    # Killed after the commit, before the ledger marked batch 3 done.
    txn = store.begin_transaction(sink.stream)
    for payload in events:
        txn.write(payload, "k")
    stats = {"transactions": 1, "events": 5, "bytes": sum(map(len, events))}
    with BatchLedger(sink.state) as ledger:
        ledger.attempt(3, _driver_plan(txn.txn_id, stats, (1, 2)))
    txn.commit()

    assert write_on_driver(sink, [handed(*events)], 3) == stats
    assert payloads(store, sink.stream) == events
    assert write_on_driver(sink, [handed(*events)], 3) == stats  # and again: done
    assert payloads(store, sink.stream) == events


def test_a_batch_whose_transaction_was_aborted_is_written_again(store, sink):
    events = batch_of(3)
    txn = store.begin_transaction(sink.stream)
    txn.write(events[0], "k")
    with BatchLedger(sink.state) as ledger:
        ledger.attempt(0, _driver_plan(txn.txn_id, None))
    txn.abort()  # its lease ran out, say
    write_on_driver(sink, [handed(*events)], 0)
    assert payloads(store, sink.stream) == events


def test_a_recorded_transaction_the_store_does_not_know_stops_the_sink(store, sink):
    with BatchLedger(sink.state) as ledger:
        ledger.attempt(2, _driver_plan("never-begun", None))
    with pytest.raises(UnknownBatchTransaction, match=r"batch 2.*never-begun"):
        write_on_driver(sink, [handed(*batch_of(2))], 2)
    assert payloads(store, sink.stream) == []


def test_handed_over_rows_are_written_in_source_order_whatever_the_task_order(store, sink):
    late = handed(*batch_of(3, first=3), partition=0, order=(0, 300))
    early = handed(*batch_of(3), partition=1, order=(0, 0))
    write_on_driver(sink, [late, None, early], 1)
    assert payloads(store, sink.stream) == batch_of(6)


def test_an_empty_batch_is_recorded_done_without_a_transaction(store, sink):
    assert write_on_driver(sink, [handed(), None], 4)["transactions"] == 0
    with BatchLedger(sink.state) as ledger:
        assert ledger.get(4).state == "done"
    assert payloads(store, sink.stream) == []


def test_auto_picks_driver_mode_for_a_store_that_cannot_flush(store, monkeypatch):
    options = {"store": store.uri, "stream": "test/target"}
    assert _sink(options).commit_mode == "tasks"
    # What the Pravega adapter declares: no `txn_flush` (it cannot run on this machine).
    monkeypatch.setattr(EmbeddedStore, "features", EmbeddedStore.features - {"txn_flush"})
    assert _sink(options).commit_mode == "driver"
    assert _sink({**options, "commitMode": "tasks"}).commit_mode == "tasks"
    with pytest.raises(ValueError, match="commitMode"):
        _sink({**options, "commitMode": "sometimes"})
