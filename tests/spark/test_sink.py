"""The `sluice` sink: exactly-once commits through the batch ledger, per-key order, aborts."""

from __future__ import annotations

import sqlite3

import pytest

from pipeline.spark.ledger import BatchLedger, BatchPlan
from tests.spark.conftest import fill, per_key_sequences

pytestmark = pytest.mark.spark


def payloads(store, stream) -> list[bytes]:
    return [e.payload for e in store.read(stream)]


def start_copy(spark, store_uri, source, target, *, checkpoint, emit="events", **sink):
    events = (
        spark.readStream.format("sluice")
        .option("store", store_uri)
        .option("stream", source)
        .option("maxEventsPerTrigger", "60")
        .option("minSplitBytes", "256")
        .option("minPartitions", "4")
        .option("emit", emit)
        .load()
    )
    if emit == "events":
        events = events.select("payload", "routing_key", "segment", "offset", "ingest_time")
    writer = (
        events.writeStream.format("sluice")
        .option("store", store_uri)
        .option("stream", target)
        .option("createSegments", "2")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
    )
    for key, value in sink.items():
        writer = writer.option(key, value)
    query = writer.start()
    query.awaitTermination(timeout=300)
    assert not query.isActive and query.exception() is None
    return query


def last_commit(checkpoint) -> int:
    return max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def forget_commit(checkpoint, batch_id: int) -> None:
    """What a driver crash right before Spark logs batch `batch_id` as done leaves behind."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


@pytest.mark.parametrize("emit", ["events", "ranges"])
def test_a_batch_spark_replays_after_a_crash_is_a_noop(spark, store, source, tmp_path, emit):
    store_uri = store.uri
    written = fill(store, source, 200)
    checkpoint = tmp_path / "ck"
    start_copy(spark, store_uri, source, "test/copy", checkpoint=checkpoint, emit=emit)
    assert sorted(payloads(store, "test/copy")) == sorted(w.payload for w in written)

    # The driver died after the sink committed batch N but before Spark logged it as done:
    # on restart Spark runs batch N again, over the same cuts.
    replayed = last_commit(checkpoint)
    forget_commit(checkpoint, replayed)
    start_copy(spark, store_uri, source, "test/copy", checkpoint=checkpoint, emit=emit)
    assert last_commit(checkpoint) == replayed
    assert sorted(payloads(store, "test/copy")) == sorted(w.payload for w in written)


def test_a_batch_recorded_but_not_marked_done_is_committed_again_harmlessly(
    spark, store, store_uri, source, tmp_path
):
    written = fill(store, source, 150)
    checkpoint = tmp_path / "ck"
    start_copy(spark, store_uri, source, "test/copy", checkpoint=checkpoint)
    replayed = last_commit(checkpoint)
    # Crash between committing the store transactions and marking the batch done.
    with sqlite3.connect(checkpoint / "sluice-sink.sqlite") as db:
        db.execute("UPDATE batches SET state='intent', stats=NULL WHERE batch_id=?", (replayed,))
    forget_commit(checkpoint, replayed)
    start_copy(spark, store_uri, source, "test/copy", checkpoint=checkpoint)
    assert sorted(payloads(store, "test/copy")) == sorted(w.payload for w in written)
    with BatchLedger(checkpoint / "sluice-sink.sqlite") as ledger:
        assert ledger.get(replayed).state == "done"


@pytest.mark.parametrize("emit", ["events", "ranges"])
def test_per_key_order_is_kept_across_split_ranges_and_a_fixed_key(
    spark, store, source, tmp_path, emit
):
    store_uri = store.uri
    for i in range(6):
        fill(store, source, 40, keys=5, first=40 * i)
    start_copy(
        spark,
        store_uri,
        source,
        "test/site",
        checkpoint=tmp_path / "ck",
        emit=emit,
        routingKey="site-1",
    )
    copied = list(store.read("test/site"))
    assert {e.routing_key for e in copied} == {"site-1"}
    assert len({e.segment for e in copied}) == 1
    sequences = per_key_sequences([e.payload for e in copied])
    expected = per_key_sequences([e.payload for e in store.read(source)])
    assert sequences == expected
    assert all(s == sorted(s) for s in sequences.values())


def test_routing_keys_are_kept_without_a_fixed_key(spark, store, store_uri, source, tmp_path):
    fill(store, source, 90, keys=3)
    start_copy(spark, store_uri, source, "test/copy", checkpoint=tmp_path / "ck")
    by_key = {(e.routing_key, e.payload) for e in store.read("test/copy")}
    assert by_key == {(e.routing_key, e.payload) for e in store.read(source)}


def test_batch_write_with_a_batch_id_is_exactly_once(spark, store, store_uri, source, tmp_path):
    fill(store, source, 80)
    df = spark.read.format("sluice").option("store", store_uri).option("stream", source).load()
    for _ in range(2):  # the same batch written twice: the second is a no-op
        (
            df.select("payload", "routing_key", "segment", "offset")
            .write.format("sluice")
            .mode("append")
            .option("store", store_uri)
            .option("stream", "test/once")
            .option("createSegments", "1")
            .option("state", str(tmp_path / "ledger.sqlite"))
            .option("batchId", "7")
            .save()
        )
    assert len(payloads(store, "test/once")) == 80


def test_a_failing_task_aborts_its_transaction(spark, store, store_uri, source, tmp_path):
    from pyspark.sql import functions as F

    fill(store, source, 30)
    df = spark.read.format("sluice").option("store", store_uri).option("stream", source).load()
    # A null payload fails the write after the task began its transaction.
    broken = df.withColumn(
        "payload", F.when(F.col("offset") > 0, F.lit(None)).otherwise(F.col("payload"))
    )
    state = tmp_path / "ledger.sqlite"
    with pytest.raises(Exception, match="payload"):
        (
            broken.select("payload", "routing_key")
            .write.format("sluice")
            .mode("append")
            .option("store", store_uri)
            .option("stream", "test/failed")
            .option("createSegments", "1")
            .option("state", str(state))
            .option("batchId", "0")
            .save()
        )
    assert payloads(store, "test/failed") == []
    markers = list((tmp_path / "ledger.sqlite.open").iterdir())
    assert markers, "the tasks marked the transactions they began"
    for marker in markers:
        assert store.get_transaction("test/failed", marker.name).state() == "aborted"


def test_transactions_orphaned_by_dead_tasks_are_aborted_by_the_next_commit(
    spark, store, store_uri, source, tmp_path
):
    fill(store, source, 20)
    store.create_stream("test/copy", segments=2)
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    orphan = store.begin_transaction("test/copy")
    orphan.write(b"from a task that died", "k0")
    orphan.flush()
    (checkpoint / "sluice-sink.sqlite.open").mkdir()
    (checkpoint / "sluice-sink.sqlite.open" / orphan.txn_id).touch()
    start_copy(spark, store_uri, source, "test/copy", checkpoint=checkpoint)
    assert store.get_transaction("test/copy", orphan.txn_id).state() == "aborted"
    assert b"from a task that died" not in payloads(store, "test/copy")
    assert not any((checkpoint / "sluice-sink.sqlite.open").iterdir())


def test_the_ledger_keeps_the_first_record_of_a_batch(tmp_path):
    first = BatchPlan(version=1, kind="txns", items=[{"txn": "a"}], stats={"events": 1})
    second = BatchPlan(version=1, kind="txns", items=[{"txn": "b"}], stats={"events": 1})
    with BatchLedger(tmp_path / "l.sqlite") as ledger:
        assert ledger.record(3, first).plan == first
        assert ledger.record(3, second).plan == first
        assert ledger.get(3).state == "intent"
        ledger.finish(3, {"events": 1})
    with BatchLedger(tmp_path / "l.sqlite") as ledger:  # durable across opens
        record = ledger.get(3)
        assert (record.state, record.stats) == ("done", {"events": 1})
        assert [r.batch_id for r in ledger.batches()] == [3]


def test_per_key_order_survives_a_scaled_source(spark, store, store_uri, tmp_path):
    """Successor segments are admitted only after their sealed predecessors are read out."""
    store.create_stream("test/scaled", segments=1)
    fill(store, "test/scaled", 120, keys=6)
    store.scale("test/scaled", [0], [(0.0, 0.5), (0.5, 1.0)])
    fill(store, "test/scaled", 120, keys=6, first=120)
    start_copy(
        spark, store_uri, "test/scaled", "test/copy", checkpoint=tmp_path / "ck", routingKey="one"
    )
    copied = [e.payload for e in store.read("test/copy")]
    assert len(copied) == 240
    sequences = per_key_sequences(copied)
    assert all(s == sorted(s) for s in sequences.values()), sequences
