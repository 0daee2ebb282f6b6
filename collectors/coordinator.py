"""The two-phase commit between an instance's SQLite buffer and a stream transaction.

Delivery guarantee: **exactly-once, in order**, from the buffer into the stream, across
crashes at any point of the collector, the store or the network. The ids of the stream
transactions that may hold buffered events are kept in the buffer's ledger and change in the
same SQLite transaction as the send queue. Two protocols: `flush` (the Pravega Sensor
Collector's, for stores that can flush a transaction) and `commit` (for stores that cannot,
such as Pravega through its Python client); `txn_protocol = "auto"` picks by the store.
Both, step by step, with recovery and why it is exactly-once: PROTOCOL.md next to this file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from collectors.buffer import Buffer
from collectors.buffer.schema import BufferedEvent, TxnRecord
from collectors.errors import ConfigError
from collectors.settings import InstanceSettings, TxnProtocol
from pipeline.failpoints import Failpoints
from pipeline.streams import StreamStore, Transaction, TxnFailed, TxnNotFound
from pipeline.wording import counted

log = logging.getLogger(__name__)

#: The protocol an instance runs, once `auto` is decided by its store.
Protocol = Literal["flush", "commit"]


def choose_protocol(settings: InstanceSettings, store: StreamStore) -> Protocol:
    """`txn_protocol` for this store: `auto` is `flush` where transactions can be flushed."""
    setting: TxnProtocol = settings.txn_protocol
    can_flush = "txn_flush" in store.features
    if setting == "auto":
        return "flush" if can_flush else "commit"
    if setting == "flush" and not can_flush:
        where = f"instance {settings.name}"
        problem = (
            f"txn_protocol = 'flush' needs a store that can flush transactions, and "
            f"{settings.store} cannot"
        )
        raise ConfigError(where, problem, 'set txn_protocol = "commit" (or "auto")')
    return setting


class TransactionCoordinator:
    """Moves batches from one instance's buffer into its stream, exactly once."""

    def __init__(
        self, store: StreamStore, buffer: Buffer, settings: InstanceSettings, failpoints: Failpoints
    ) -> None:
        self.store = store
        self.buffer = buffer
        self.ledger = buffer.ledger
        self.settings = settings
        self.failpoints = failpoints
        self.protocol = choose_protocol(settings, store)
        # Committed in the store, not yet forgotten in the buffer (see `send_batch`).
        self._committed: TxnRecord | None = None

    def recover(self) -> int:
        """Resolve every recorded transaction: abort `open` ones of the flush protocol,
        commit `ready` ones, and settle `open` ones that carry a batch by the store's word.

        Returns how many were resolved. Store errors propagate (the caller retries later);
        nothing is sent while a recorded transaction is unresolved.
        """
        resolved = 0
        known = self._committed.txn_id if self._committed else None
        for record in self.ledger.txns():
            if record.txn_id == known:
                continue
            if record.state == "open" and record.first_id is None:
                self._abort_recorded(record)
            elif record.state == "open":
                self._settle_open(record)
            elif record.state == "ready":
                self._commit_recorded(record)
            else:
                continue
            resolved += 1
        return resolved

    def send_batch(self) -> int:
        """Send the oldest queued events as one stream transaction; return how many."""
        batch = self.buffer.next_batch(
            self.settings.max_events_per_txn, self.settings.max_txn_bytes
        )
        if not batch:
            self.forget_committed()
            return 0
        self.failpoints.hit("sender.before_begin")
        txn = self.store.begin_transaction(
            self.settings.stream, lease_seconds=self.settings.txn_lease_seconds
        )
        if self.protocol == "flush":
            self._send_flushed(txn, batch)
        else:
            self._send_committed(txn, batch)
        return len(batch)

    def _send_flushed(self, txn: Transaction, batch: Sequence[BufferedEvent]) -> None:
        """Steps 1-4 of the flush protocol (step 5 comes with the next batch)."""
        self._record_open(txn)
        self._write(txn, batch, flush=True)
        self.failpoints.hit("sender.after_flush")
        record = self.ledger.mark_ready(txn.txn_id, self.settings.stream, batch)
        self.failpoints.hit("sender.after_ready")
        self._commit_recorded(record, txn)

    def _send_committed(self, txn: Transaction, batch: Sequence[BufferedEvent]) -> None:
        """Steps 1-2 of the commit protocol (step 3 comes with the next batch).

        A commit that fails in any other way than "the store aborted it" may or may not have
        happened: the record stays, and recovery asks the store before anything else is
        sent."""
        record = self._record_open(txn, batch)
        self._write(txn, batch, flush=False)
        self.failpoints.hit("sender.before_commit")
        try:
            txn.commit(time_bounds=record.time_bounds)
        except TxnFailed as exc:
            if exc.state != "aborted":
                raise
            log.warning(
                "%s: the store aborted transaction %s before it committed (%s): its %s "
                "go back to the queue and will be sent again in a new transaction",
                self.settings.name,
                txn.txn_id,
                exc.reason,
                counted(record.events, "event"),
            )
            self.ledger.drop_open(txn.txn_id)
            return
        self.failpoints.hit("sender.after_stream_commit")
        self._committed = record  # forgotten with the next batch's step 1, or when idle

    def _record_open(self, txn: Transaction, batch: Sequence[BufferedEvent] = ()) -> TxnRecord:
        """Record `txn` as open (with `batch` under the commit protocol), forgetting the
        last committed transaction in the same SQLite commit."""
        record = self.ledger.record_open(txn.txn_id, self.settings.stream, self._committed, batch)
        if self._committed is not None:
            self._committed = None
            self.failpoints.hit("sender.after_forget")
        self.failpoints.hit("sender.after_record_open")
        return record

    def _write(self, txn: Transaction, batch: Sequence[BufferedEvent], flush: bool) -> None:
        """Write the batch into `txn` (and flush it); abort `txn` if that fails."""
        try:
            for index, event in enumerate(batch):
                txn.write(event.payload, event.routing_key)
                if index == 0:
                    self.failpoints.hit("sender.mid_write")
            if flush:
                txn.flush()
        except BaseException:
            self._abort_quietly(txn)
            raise

    def _abort_quietly(self, txn: Transaction) -> None:
        """Abort a transaction whose writes failed; if even that fails, recovery retries."""
        try:
            txn.abort()
        except Exception as exc:  # the original error is the one worth raising
            log.warning("%s: could not abort %s yet (%s)", self.settings.name, txn.txn_id, exc)
            return
        self.ledger.drop_open(txn.txn_id)

    def _abort_recorded(self, record: TxnRecord) -> None:
        try:
            self.store.get_transaction(record.stream, record.txn_id).abort()
        except (TxnNotFound, TxnFailed):
            pass  # never reached the store, or already aborted: nothing of it is visible
        log.info("%s: aborted unfinished transaction %s", self.settings.name, record.txn_id)
        self.ledger.drop_open(record.txn_id)

    def _commit_recorded(self, record: TxnRecord, txn: Transaction | None = None) -> None:
        """Commit a `ready` transaction (`txn` if at hand, else looked up by its id)."""
        recommit = txn is None
        try:
            if txn is None:
                txn = self.store.get_transaction(record.stream, record.txn_id)
            txn.commit(time_bounds=record.time_bounds)
        except TxnFailed as exc:
            log.warning(
                "%s: the store aborted transaction %s (%s): its %s go back to the queue "
                "and will be sent again in a new transaction",
                self.settings.name,
                record.txn_id,
                exc.reason,
                counted(record.events, "event"),
            )
            self.ledger.requeue(record)
            return
        except TxnNotFound:
            self._doubtful(record)
            return
        self.failpoints.hit("sender.after_stream_commit")
        if recommit:
            self._forget_recommitted(record)
        else:
            self._committed = record  # forgotten with the next batch's step 1, or when idle

    def _settle_open(self, record: TxnRecord) -> None:
        """Commit protocol: the store's state of a recorded transaction decides its batch."""
        try:
            txn = self.store.get_transaction(record.stream, record.txn_id)
            state = txn.state()
        except TxnNotFound:
            self._doubtful(record)
            return
        if state in ("committing", "committed"):
            txn.commit(time_bounds=record.time_bounds)  # finishes a cut-short commit, or no-op
            self.failpoints.hit("sender.after_stream_commit")
            self._forget_recommitted(record)
            return
        if state == "open":
            txn.abort()  # it never committed: nothing of it is visible, nor will be
        log.info(
            "%s: transaction %s did not commit (%s): its %s go back to the queue",
            self.settings.name,
            record.txn_id,
            state,
            counted(record.events, "event"),
        )
        self.ledger.drop_open(record.txn_id)

    def _forget_recommitted(self, record: TxnRecord) -> None:
        log.info("%s: committed recorded transaction %s", self.settings.name, record.txn_id)
        self.ledger.forget(record, recommitted=True)
        self.failpoints.hit("sender.after_forget")

    def forget_committed(self) -> None:
        """Forget the last committed transaction now (the queue is empty, or we stop)."""
        if self._committed is not None:
            self.ledger.forget(self._committed)
            self._committed = None
            self.failpoints.hit("sender.after_forget")

    def _doubtful(self, record: TxnRecord) -> None:
        note = (
            f"the store does not know transaction {record.txn_id}: its "
            f"{counted(record.events, 'event')} (buffer ids {record.first_id}.."
            f"{record.last_id}) may or may not be in {record.stream}; they are kept, not re-sent"
        )
        log.error("%s: %s", self.settings.name, note)
        self.ledger.mark_doubtful(record, note)
        self.buffer.record_error("sender", note)
