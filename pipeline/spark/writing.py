"""Writing a DataFrame into a stream: the exactly-once `sluice` sink (batch and streaming).

Rows need a `payload` column (binary or string); a `routing_key` column routes each row, or
the `routingKey` option gives every row one fixed key (one per edge site). When the rows come
from the `sluice` source, its `segment`/`offset` columns order the commit and its
`ingest_time` becomes the transaction's time bounds. Range rows of the source
(`emit=ranges`) are copied by the task itself, event by event from the source store, so the
payloads never pass through the JVM (the mirror job does this).

How a micro-batch lands, exactly once:

- each **task** (executor) writes its rows into its own store transaction, flushes it (the
  events are durable but invisible) and returns the transaction id in its commit message; a
  task that fails aborts its transaction;
- the **driver**'s `commit(messages, batchId)` records the batch id with the transaction ids
  in the batch ledger (`ledger.py`, SQLite next to the checkpoint) in one SQLite transaction,
  then commits the store transactions in source order — committing twice is a no-op — and
  marks the batch done.

After a driver crash Spark re-runs the batch: new tasks write new transactions, but the
ledger already holds batch N, so the earlier transactions are committed (again, harmlessly)
and the new ones aborted; a batch already done publishes nothing. Per routing key, order is
kept: a key lives in one source segment, each range is one transaction, and transactions
commit in (segment, offset) order, one after the other.

Transactions left open by tasks that died with their executor are found through marker
files (`<state>.open/<txn id>`, written by a task before its first event when it can see the
state directory) and aborted by the next driver commit.

A batch write (`df.write.format("sluice")`) is exactly-once only with the `state` and
`batchId` options (a re-run of the same batch id is then a no-op); without them it commits
the transactions directly and is at-least-once across a driver crash during commit.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from pipeline.spark.ledger import LEDGER_VERSION, BatchLedger, BatchPlan
from pipeline.spark.options import SinkOptions
from pipeline.streams import StreamStore, Transaction, TxnFailed, TxnNotFound, open_store

if TYPE_CHECKING:  # pyarrow is imported where tasks run, not in the driver's commit process
    import pyarrow as pa


@dataclass(frozen=True)
class TxnMessage(WriterCommitMessage):
    """What one task wrote: its transaction (None if it had no rows) and where it came from."""

    txn_id: str | None
    partition: int
    order: tuple[int, int] | None
    events: int
    bytes: int
    time_bounds: tuple[int, int] | None


def _task_partition() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _marker_dir(opts: SinkOptions) -> Path | None:
    if opts.state is None:
        return None
    directory = Path(f"{opts.state}.open")
    return directory if directory.parent.is_dir() else None


class _TaskWriter:
    """Writes one task's rows into one transaction (executor side)."""

    def __init__(self, opts: SinkOptions, store: StreamStore) -> None:
        self.opts, self.store = opts, store
        self.txn: Transaction | None = None
        self.events = self.bytes = 0
        self.order: tuple[int, int] | None = None
        self.t_min: int | None = None
        self.t_max: int | None = None

    def _transaction(self) -> Transaction:
        if self.txn is None:
            self.txn = self.store.begin_transaction(self.opts.stream)
            self._mark(self.txn.txn_id)
        return self.txn

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if "payload" not in batch.schema.names and "start" in batch.schema.names:
            for row in batch.to_pylist():
                self.write_range(row)
            return
        txn = self._transaction()
        payloads = _payloads(batch)
        keys = self._keys(batch)
        for payload, key in zip(payloads, keys, strict=True):
            txn.write(payload, key)
            self.bytes += len(payload)
        self.events += batch.num_rows
        self._track(batch)

    def write_range(self, row: dict) -> None:
        """A range row of the `sluice` source (`emit=ranges`): copy its events from the
        source store straight into the transaction, in order."""
        if self.order is None:
            self.order = (row["segment"], row["start"])
        fixed = self.opts.routing_key
        with open_store(row["store"]) as source:
            events = source.read_segment(row["stream"], row["segment"], row["start"], row["end"])
            for event in events:
                self._transaction().write(event.payload, fixed or event.routing_key)
                self.events += 1
                self.bytes += len(event.payload)
                self._time(event.ingest_time_ns, event.ingest_time_ns)

    def _time(self, low: int, high: int) -> None:
        self.t_min = low if self.t_min is None else min(self.t_min, low)
        self.t_max = high if self.t_max is None else max(self.t_max, high)

    def _keys(self, batch: pa.RecordBatch) -> list[str | None]:
        if self.opts.routing_key is not None:
            return [self.opts.routing_key] * batch.num_rows
        if "routing_key" in batch.schema.names:
            return batch.column("routing_key").to_pylist()
        return [None] * batch.num_rows

    def _track(self, batch: pa.RecordBatch) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc

        names = batch.schema.names
        if self.order is None and "segment" in names and "offset" in names:
            self.order = (batch.column("segment")[0].as_py(), batch.column("offset")[0].as_py())
        if "ingest_time" in names:
            times = batch.column("ingest_time").cast(pa.int64())
            unit = 1000 if pa.types.is_timestamp(batch.schema.field("ingest_time").type) else 1
            low, high = pc.min(times).as_py(), pc.max(times).as_py()
            if low is not None:
                self._time(low * unit, high * unit)

    def _mark(self, txn_id: str) -> None:
        directory = _marker_dir(self.opts)
        if directory is not None:
            directory.mkdir(exist_ok=True)
            (directory / txn_id).touch()

    def finish(self) -> TxnMessage:
        if self.txn is not None:
            self.txn.flush()
        bounds = (self.t_min, self.t_max) if self.t_min is not None else None
        return TxnMessage(
            txn_id=self.txn.txn_id if self.txn is not None else None,
            partition=_task_partition(),
            order=self.order,
            events=self.events,
            bytes=self.bytes,
            time_bounds=bounds,  # type: ignore[arg-type]
        )

    def abort(self) -> None:
        if self.txn is not None:
            with contextlib.suppress(Exception):
                self.txn.abort()


def _payloads(batch: pa.RecordBatch) -> list[bytes]:
    import pyarrow as pa

    if "payload" not in batch.schema.names:
        msg = "the sluice sink needs a `payload` column (binary or string)"
        raise ValueError(msg)
    column = batch.column("payload")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def write_task(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> TxnMessage:
    """One task: all its rows in one flushed, uncommitted transaction."""
    with open_store(opts.store) as store:
        writer = _TaskWriter(opts, store)
        try:
            for batch in batches:
                writer.write(batch)
            return writer.finish()
        except BaseException:
            writer.abort()
            raise


def ordered(messages: list[Any]) -> list[TxnMessage]:
    """The tasks' messages that hold a transaction, in source order (then task order)."""
    found = [m for m in messages if isinstance(m, TxnMessage) and m.txn_id is not None]
    return sorted(found, key=lambda m: (m.order or (-1, -1), m.partition))


def txn_plan(messages: list[Any]) -> BatchPlan:
    items = [
        {"txn": m.txn_id, "time_bounds": m.time_bounds, "events": m.events, "bytes": m.bytes}
        for m in ordered(messages)
    ]
    stats = {
        "transactions": len(items),
        "events": sum(int(i["events"]) for i in items),
        "bytes": sum(int(i["bytes"]) for i in items),
    }
    return BatchPlan(version=LEDGER_VERSION, kind="txns", items=items, stats=stats)


def commit_batch(opts: SinkOptions, messages: list[Any], batch_id: int | None) -> dict:
    """Commit a batch's transactions exactly once (with a ledger) and return its counts."""
    plan = txn_plan(messages)
    with open_store(opts.store) as store:
        if opts.state is None or batch_id is None:
            publish_txns(store, opts.stream, plan)
            return plan["stats"]
        with BatchLedger(opts.state) as ledger:
            record = ledger.record(batch_id, plan)
            if record.state != "done":
                publish_txns(store, opts.stream, record.plan)
                ledger.finish(batch_id, record.plan["stats"])
            published = {item["txn"] for item in record.plan["items"]}
        sweep_open(store, opts, keep=published)
        return record.plan["stats"]


def publish_txns(store: StreamStore, stream: str, plan: BatchPlan) -> None:
    for item in plan["items"]:
        bounds = tuple(item["time_bounds"]) if item.get("time_bounds") else None
        store.get_transaction(stream, item["txn"]).commit(time_bounds=bounds)  # type: ignore[arg-type]


def abort_txns(opts: SinkOptions, messages: list[Any]) -> None:
    with open_store(opts.store) as store:
        for message in ordered(messages):
            with contextlib.suppress(TxnFailed, TxnNotFound):
                store.get_transaction(opts.stream, str(message.txn_id)).abort()


def sweep_open(store: StreamStore, opts: SinkOptions, keep: set[str]) -> None:
    """Abort transactions that tasks began but no recorded batch publishes; drop markers."""
    directory = _marker_dir(opts)
    if directory is None or not directory.is_dir():
        return
    for marker in directory.iterdir():
        if marker.name not in keep:
            with contextlib.suppress(TxnFailed, TxnNotFound):
                txn = store.get_transaction(opts.stream, marker.name)
                if txn.state() == "open":
                    txn.abort()
        marker.unlink(missing_ok=True)


class SluiceStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes into a stream; exactly-once through the batch ledger (module doc)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnMessage:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        commit_batch(self.opts, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        abort_txns(self.opts, messages)


class SluiceBatchWriter(DataSourceArrowWriter):
    """Batch writes into a stream: exactly-once with `state` + `batchId` (module doc)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnMessage:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[Any]) -> None:
        commit_batch(self.opts, messages, self.opts.batch_id)

    def abort(self, messages: list[Any]) -> None:
        abort_txns(self.opts, messages)
