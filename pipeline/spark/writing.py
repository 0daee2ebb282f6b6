"""Writing a DataFrame into a stream: the exactly-once `sluice` sink (batch and streaming).

Each task writes its rows (or copies its source ranges) into its own store transaction and
flushes it; the driver's `commit(messages, batchId)` records the batch in the ledger
(`ledger.py`) and then commits the transactions in source order, so a batch Spark re-runs is
committed once. With `commitMode=driver` (Pravega, whose client cannot flush a transaction)
the driver writes the whole batch into one transaction, recorded per attempt. Delivery:
**exactly-once**, per-key order kept; a batch write without `state` + `batchId` is
at-least-once. The protocol, crash by crash: `DESIGN.md`, "The `sluice` sink"."""

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

from pipeline.spark.errors import SparkSourceError
from pipeline.spark.ledger import LEDGER_VERSION, BatchLedger, BatchPlan, BatchRecord
from pipeline.spark.options import SinkOptions, source_store
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


@dataclass(frozen=True)
class HandoverMessage(WriterCommitMessage):
    """What one task hands the driver to write (`commitMode=driver`): source range rows to
    copy, and event rows as (payload, routing key) pairs, with where they came from."""

    partition: int
    order: tuple[int, int] | None
    ranges: tuple[dict[str, Any], ...]
    events: tuple[tuple[bytes, str | None], ...]
    time_bounds: tuple[int, int] | None


class UnknownBatchTransaction(SparkSourceError):
    """A re-run batch's recorded transaction is unknown to the store: whether it committed
    cannot be told, so the sink stops instead of risking a duplicate or a gap."""

    def __init__(self, batch_id: int, txn_id: str, stream: str) -> None:
        self.batch_id, self.txn_id = batch_id, txn_id
        super().__init__(
            f"batch {batch_id}: the store no longer knows transaction {txn_id} of {stream}, so "
            "whether the batch was published cannot be told; check the stream's tail against "
            "the source and restart from a new checkpoint"
        )


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

    def __init__(
        self, opts: SinkOptions, store: StreamStore, txn: Transaction | None = None
    ) -> None:
        self.opts, self.store = opts, store
        self.txn = txn
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
        for payload, key in zip(_payloads(batch), self._keys(batch), strict=True):
            self.write_event(payload, key)
        self._track(batch)

    def write_event(self, payload: bytes, key: str | None) -> None:
        self._transaction().write(payload, key)
        self.events += 1
        self.bytes += len(payload)

    def write_range(self, row: dict) -> None:
        """A range row of the `sluice` source (`emit=ranges`): copy its events from the
        source store straight into the transaction, in order."""
        if self.order is None:
            self.order = (row["segment"], row["start"])
        fixed = self.opts.routing_key
        with source_store(row["store"]) as source:
            events = source.read_segment(row["stream"], row["segment"], row["start"], row["end"])
            for event in events:
                self.write_event(event.payload, event.routing_key if fixed is None else fixed)
                self.add_time(event.ingest_time_ns, event.ingest_time_ns)

    def add_time(self, low: int, high: int) -> None:
        self.t_min = low if self.t_min is None else min(self.t_min, low)
        self.t_max = high if self.t_max is None else max(self.t_max, high)

    @property
    def time_bounds(self) -> tuple[int, int] | None:
        if self.t_min is None or self.t_max is None:
            return None
        return (self.t_min, self.t_max)

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
                self.add_time(low * unit, high * unit)

    def _mark(self, txn_id: str) -> None:
        directory = _marker_dir(self.opts)
        if directory is not None:
            directory.mkdir(exist_ok=True)
            (directory / txn_id).touch()

    def finish(self) -> TxnMessage:
        if self.txn is not None:
            self.txn.flush()
        return TxnMessage(
            txn_id=self.txn.txn_id if self.txn is not None else None,
            partition=_task_partition(),
            order=self.order,
            events=self.events,
            bytes=self.bytes,
            time_bounds=self.time_bounds,
        )

    def abort(self) -> None:
        if self.txn is not None:
            with contextlib.suppress(Exception):
                self.txn.abort()


class _Handover(_TaskWriter):
    """Collects one task's rows for the driver to write (`commitMode=driver`, executor side)."""

    def __init__(self, opts: SinkOptions) -> None:
        super().__init__(opts, store=None)  # type: ignore[arg-type]
        self.ranges: list[dict[str, Any]] = []
        self.pairs: list[tuple[bytes, str | None]] = []

    def write_range(self, row: dict) -> None:
        if self.order is None:
            self.order = (row["segment"], row["start"])
        self.ranges.append(row)

    def write_event(self, payload: bytes, key: str | None) -> None:
        self.pairs.append((payload, key))
        self.events += 1
        self.bytes += len(payload)

    def finish(self) -> HandoverMessage:  # type: ignore[override]
        return HandoverMessage(
            partition=_task_partition(),
            order=self.order,
            ranges=tuple(self.ranges),
            events=tuple(self.pairs),
            time_bounds=self.time_bounds,
        )


def _payloads(batch: pa.RecordBatch) -> list[bytes]:
    import pyarrow as pa

    if "payload" not in batch.schema.names:
        msg = "the sluice sink needs a `payload` column (binary or string)"
        raise ValueError(msg)
    column = batch.column("payload")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def write_task(
    opts: SinkOptions, batches: Iterator[pa.RecordBatch]
) -> TxnMessage | HandoverMessage:
    """One task: all its rows in one flushed, uncommitted transaction (or, with
    `commitMode=driver`, handed over to the driver)."""
    if opts.commit_mode == "driver":
        handover = _Handover(opts)
        for batch in batches:
            handover.write(batch)
        return handover.finish()
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
    if opts.commit_mode == "driver":
        return write_on_driver(opts, messages, batch_id)
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


@dataclass(frozen=True)
class _Attempts:
    """Where `commitMode=driver` records batch N's attempts: the ledger, or nowhere for a
    batch write without `state` and `batchId` (exactly-once only while its driver lives)."""

    ledger: BatchLedger | None
    batch_id: int | None

    def record(self, plan: BatchPlan) -> None:
        if self.ledger is not None and self.batch_id is not None:
            self.ledger.attempt(self.batch_id, plan)

    def finish(self, stats: dict[str, Any]) -> None:
        if self.ledger is not None and self.batch_id is not None:
            self.ledger.finish(self.batch_id, stats)


def write_on_driver(opts: SinkOptions, messages: list[Any], batch_id: int | None) -> dict:
    """`commitMode=driver`: the batch's handed-over rows in one transaction (module doc)."""
    handed = sorted(
        (m for m in messages if isinstance(m, HandoverMessage) and (m.ranges or m.events)),
        key=lambda m: (m.order or (-1, -1), m.partition),
    )
    with open_store(opts.store) as store:
        if opts.state is None or batch_id is None:
            return _publish_handed(store, opts, handed, _Attempts(None, None))
        with BatchLedger(opts.state) as ledger:
            earlier = ledger.get(batch_id)
            if earlier is not None and earlier.state == "done":
                return earlier.stats or {}
            if earlier is not None and _finished_before(store, opts.stream, earlier):
                stats = earlier.plan["stats"]
                ledger.finish(batch_id, stats)
                return stats
            return _publish_handed(store, opts, handed, _Attempts(ledger, batch_id))


def _finished_before(store: StreamStore, stream: str, record: BatchRecord) -> bool:
    """Whether an earlier attempt's transaction reached the store (then commit it again, a
    no-op); if it is still open it is aborted, so the batch can be written again."""
    if not record.plan["items"]:
        return False
    txn_id = str(record.plan["items"][0]["txn"])
    try:
        txn = store.get_transaction(stream, txn_id)
        state = txn.state()
        if state in ("committing", "committed"):
            txn.commit()
            return True
        if state == "open":
            txn.abort()
        return False
    except TxnFailed:
        return False  # aborted meanwhile: write the batch again
    except TxnNotFound:
        raise UnknownBatchTransaction(record.batch_id, txn_id, stream) from None


def _publish_handed(
    store: StreamStore, opts: SinkOptions, handed: list[HandoverMessage], attempts: _Attempts
) -> dict:
    stats: dict[str, Any] = {"transactions": 0, "events": 0, "bytes": 0}
    if not handed:
        attempts.record(_driver_plan(None, stats))
        attempts.finish(stats)
        return stats
    txn = store.begin_transaction(opts.stream)
    attempts.record(_driver_plan(txn.txn_id, None))
    writer = _TaskWriter(opts, store, txn)
    try:
        for message in handed:
            for row in message.ranges:
                writer.write_range(row)
            for payload, key in message.events:
                writer.write_event(payload, key)
            if message.time_bounds is not None:
                writer.add_time(*message.time_bounds)
    except BaseException:
        writer.abort()
        raise
    stats = {"transactions": 1, "events": writer.events, "bytes": writer.bytes}
    attempts.record(_driver_plan(txn.txn_id, stats, writer.time_bounds))
    txn.commit(time_bounds=writer.time_bounds)
    attempts.finish(stats)
    return stats


def _driver_plan(
    txn_id: str | None, stats: dict[str, Any] | None, bounds: tuple[int, int] | None = None
) -> BatchPlan:
    """Batch N's intent in `commitMode=driver`: its one transaction; the counts once written."""
    items = [{"txn": txn_id, "time_bounds": bounds}] if txn_id is not None else []
    return BatchPlan(version=LEDGER_VERSION, kind="driver-txn", items=items, stats=stats or {})


class SluiceStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes into a stream; exactly-once through the batch ledger (module doc)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnMessage | HandoverMessage:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        commit_batch(self.opts, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        abort_txns(self.opts, messages)


class SluiceBatchWriter(DataSourceArrowWriter):
    """Batch writes into a stream: exactly-once with `state` + `batchId` (module doc)."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TxnMessage | HandoverMessage:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[Any]) -> None:
        commit_batch(self.opts, messages, self.opts.batch_id)

    def abort(self, messages: list[Any]) -> None:
        abort_txns(self.opts, messages)
