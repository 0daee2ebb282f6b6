"""The two-phase commit between an instance's SQLite buffer and a stream transaction.

Delivery guarantee: **exactly-once, in order**, from the buffer into the stream, across
crashes at any point (SIGKILL, power cut) of the collector, the store or the network.

Why it holds: the buffer always holds both (1) the ids of stream transactions that are
flushed and ready to commit and (2) the events still to send, and the two change together in
one SQLite transaction (the protocol of the Pravega Sensor Collector, seed 000 "Recovery from
Failures"). For each batch:

1. begin a stream transaction and note its id as `open` (a crash from here to step 3 leaves
   an `open` id, which recovery aborts: nothing of it was ever visible);
2. write the batch's events into it and flush (durable in the store, not visible);
3. in ONE SQLite transaction, the batch leaves the send queue and the id is recorded as
   `ready` (a crash after this point can no longer send the batch again);
4. commit the stream transaction with the event-time bounds of its samples;
5. forget the id and drop the batch's rows (one SQLite transaction; while more batches
   wait, the same SQLite transaction as step 1 of the next batch).

On start-up and before every batch, recorded `ready` ids are committed again: committing a
committed transaction is a no-op, so a crash between 3 and 5 costs nothing. Batches are sent
one at a time, oldest first, so the stream receives them in the order they were buffered.

Unlike the reference, the rows of a `ready` transaction are dropped only once it is committed
(step 5, not step 3): if the store reports the transaction aborted (its lease ran out during
a long outage), its events go back to the head of the queue and are sent again, instead of
being lost. If the store no longer knows the id at all, whether it committed cannot be told:
the rows are kept as `doubtful`, reported, and never re-sent automatically.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from collectors.buffer import Buffer
from collectors.config import InstanceConfig
from collectors.failpoints import Failpoints
from collectors.state import BufferedEvent, TxnRecord
from pipeline.streams import StreamStore, Transaction, TxnFailed, TxnNotFound

log = logging.getLogger(__name__)


class TransactionCoordinator:
    """Moves batches from one instance's buffer into its stream, exactly once."""

    def __init__(
        self, store: StreamStore, buffer: Buffer, config: InstanceConfig, failpoints: Failpoints
    ) -> None:
        self.store = store
        self.buffer = buffer
        self.config = config
        self.failpoints = failpoints
        # Committed in the store, not yet forgotten in the buffer (see `send_batch`).
        self._committed: TxnRecord | None = None

    def recover(self) -> int:
        """Resolve every recorded transaction: abort `open` ones, commit `ready` ones.

        Returns how many were resolved. Store errors propagate (the caller retries later);
        nothing is sent while a recorded transaction is unresolved.
        """
        resolved = 0
        known = self._committed.txn_id if self._committed else None
        for record in self.buffer.txns():
            if record.txn_id == known:
                continue
            if record.state == "open":
                self._abort_recorded(record)
            elif record.state == "ready":
                self._commit_recorded(record)
            else:
                continue
            resolved += 1
        return resolved

    def send_batch(self) -> int:
        """Send the oldest queued events as one stream transaction; return how many."""
        batch = self.buffer.next_batch(self.config.max_events_per_txn, self.config.max_txn_bytes)
        if not batch:
            self.forget_committed()
            return 0
        stream = self.config.stream
        self.failpoints.hit("sender.before_begin")
        txn = self.store.begin_transaction(stream, lease_seconds=self.config.txn_lease_seconds)
        self.buffer.record_open(txn.txn_id, stream, forget=self._committed)
        if self._committed is not None:
            self._committed = None
            self.failpoints.hit("sender.after_forget")
        self.failpoints.hit("sender.after_record_open")
        self._write_and_flush(txn, batch)
        self.failpoints.hit("sender.after_flush")
        record = self.buffer.mark_ready(txn.txn_id, stream, batch)
        self.failpoints.hit("sender.after_ready")
        self._commit_recorded(record, txn)
        return len(batch)

    def _write_and_flush(self, txn: Transaction, batch: Sequence[BufferedEvent]) -> None:
        try:
            for index, event in enumerate(batch):
                txn.write(event.payload, event.routing_key)
                if index == 0:
                    self.failpoints.hit("sender.mid_write")
            txn.flush()
        except BaseException:
            self._abort_quietly(txn)
            raise

    def _abort_quietly(self, txn: Transaction) -> None:
        """Abort a transaction whose writes failed; if even that fails, recovery retries."""
        try:
            txn.abort()
        except Exception as exc:  # the original error is the one worth raising
            log.warning("%s: could not abort %s yet (%s)", self.config.name, txn.txn_id, exc)
            return
        self.buffer.drop_open(txn.txn_id)

    def _abort_recorded(self, record: TxnRecord) -> None:
        try:
            self.store.get_transaction(record.stream, record.txn_id).abort()
        except (TxnNotFound, TxnFailed):
            pass  # never reached the store, or already aborted: nothing of it is visible
        log.info("%s: aborted unfinished transaction %s", self.config.name, record.txn_id)
        self.buffer.drop_open(record.txn_id)

    def _commit_recorded(self, record: TxnRecord, txn: Transaction | None = None) -> None:
        """Commit a `ready` transaction (`txn` if at hand, else looked up by its id)."""
        recommit = txn is None
        try:
            if txn is None:
                txn = self.store.get_transaction(record.stream, record.txn_id)
            txn.commit(time_bounds=record.time_bounds)
        except TxnFailed as exc:
            log.warning(
                "%s: the store aborted transaction %s (%s): its %d events go back to the queue "
                "and will be sent again in a new transaction",
                self.config.name,
                record.txn_id,
                exc.reason,
                record.events,
            )
            self.buffer.requeue(record)
            return
        except TxnNotFound:
            self._doubtful(record)
            return
        self.failpoints.hit("sender.after_stream_commit")
        if recommit:
            log.info("%s: committed recorded transaction %s", self.config.name, record.txn_id)
            self.buffer.forget(record, recommitted=True)
            self.failpoints.hit("sender.after_forget")
        else:
            self._committed = record  # forgotten with the next batch's step 1, or when idle

    def forget_committed(self) -> None:
        """Forget the last committed transaction now (the queue is empty, or we stop)."""
        if self._committed is not None:
            self.buffer.forget(self._committed)
            self._committed = None
            self.failpoints.hit("sender.after_forget")

    def _doubtful(self, record: TxnRecord) -> None:
        note = (
            f"the store does not know transaction {record.txn_id}: its {record.events} events "
            f"(buffer ids {record.first_id}..{record.last_id}) may or may not be in "
            f"{record.stream}; they are kept, not re-sent"
        )
        log.error("%s: %s", self.config.name, note)
        self.buffer.mark_doubtful(record, note)
        self.buffer.record_error("sender", note)
