"""Writers and transactions on a Pravega stream, and what this client cannot promise.

A writer is exactly-once per writer object and at-least-once across a crash (no caller writer
id: `writer_id=...` is `Unsupported`). A transaction is exactly-once for a caller that keeps its
input until `commit()` returns and asks `state()` after a crash; `flush()` is `Unsupported` (the
client confirms a transaction's events only at commit), its lease is the client's fixed 90 s,
and its state comes from the controller (`controller.py`). ADAPTER.md says why, gap by gap.
"""

from __future__ import annotations

import uuid
from typing import Any

from pipeline.streams.api import EventWriter, Transaction
from pipeline.streams.errors import (
    StreamStoreError,
    TxnFailed,
    TxnNotFound,
    Unsupported,
)
from pipeline.streams.pravega.controller import ControllerChannel, ControllerTxnState
from pipeline.streams.values import TxnState, check_event

BACKEND = "Pravega (python client 0.3.8)"
CLIENT_TXN_LEASE_SECONDS = 90.0
_TERMINAL: dict[ControllerTxnState, TxnState] = {
    "committing": "committing",
    "committed": "committed",
    "aborting": "aborted",
    "aborted": "aborted",
}


def format_txn_id(txn_id: int) -> str:
    """Pravega shows a transaction id as the UUID of its 128 bits."""
    return str(uuid.UUID(int=txn_id))


def parse_txn_id(text: str) -> int:
    try:
        return uuid.UUID(str(text)).int
    except ValueError:
        raise TxnNotFound(str(text)) from None


class PravegaWriter(EventWriter):
    """Appends through the client's event writer.

    Delivery: exactly-once while this object lives (the client's own writer id and event
    numbers make its internal retries safe), at-least-once across a crash (a resend appends
    again; the client accepts no caller-given writer id). `flush()` returns once every event
    written so far is acknowledged by the segment store, which has made it durable.
    """

    writer_id = None

    def __init__(self, client_writer: Any, call: Any, stream: str) -> None:
        self._writer, self._call, self.stream = client_writer, call, stream

    def write(
        self, payload: bytes, routing_key: str | None = None, event_number: int | None = None
    ) -> None:
        if event_number is not None:
            raise no_writer_ids()
        data = check_event(payload, routing_key)
        self._call("write", lambda: self._writer.write_event_bytes(data, routing_key))

    def flush(self) -> None:
        self._call("flush", self._writer.flush)

    def last_event_number(self) -> int:
        raise no_writer_ids()


def no_writer_ids() -> Unsupported:
    return Unsupported(
        BACKEND,
        "deduplicate resends by a caller-given writer id and event numbers",
        "write through a transaction (begin_transaction, write, commit; a commit is idempotent "
        "and its id survives a restart), or use the embedded store",
    )


class PravegaTransaction(Transaction):
    """A Pravega transaction: atomic, its events contiguous per segment once committed.

    Exactly-once when the caller keeps its input until `commit()` returns and, after a crash,
    looks the transaction up by id: `state()` is then exact (asked of the controller), so the
    caller knows whether to drop its input (committed) or resend it (aborted, or open: abort it
    first, since events of a dead writer may be missing). `flush()` is unsupported (see the
    module docstring); `commit()` itself waits for every event of this handle to be stored.

    A handle looked up by id without the client object that wrote it (another process, or
    after a restart) can read the state, abort, and "commit" a transaction that is already
    committed; committing an *open* one through it is refused, because nothing can tell
    whether all of its events reached Pravega.
    """

    def __init__(
        self,
        stream: str,
        txn_id: int,
        controller: ControllerChannel,
        call: Any,
        *,
        handle: Any = None,
        reopen: Any = None,
    ) -> None:
        self.stream = stream
        self.txn_id = format_txn_id(txn_id)
        self._id = txn_id
        self._controller, self._call = controller, call
        self._handle, self._reopen = handle, reopen
        self._foreign = handle is None
        self._known: TxnState | None = None

    def __repr__(self) -> str:
        return f"PravegaTransaction({self.stream!r}, {self.txn_id!r})"

    def write(self, payload: bytes, routing_key: str | None = None) -> None:
        data = check_event(payload, routing_key)
        if self._known is not None:
            raise TxnFailed(self.txn_id, self._known, f"it is already {self._known}")
        handle = self._writer_handle("write to a transaction")
        self._call("write to a transaction", lambda: handle.write_event_bytes(data, routing_key))

    def flush(self) -> None:
        raise Unsupported(
            BACKEND,
            "make a transaction's events durable before commit (the client has no flush)",
            "keep your input until commit() returns; after a crash call "
            "get_transaction(stream, id).state(): 'committed' means done, anything else "
            "means abort() and resend",
        )

    def commit(self, time_bounds: tuple[int, int] | None = None) -> None:
        stamp = _commit_timestamp_ms(time_bounds)
        state = self.state()
        if state in ("committed", "committing"):
            return
        if state == "aborted":
            raise TxnFailed(self.txn_id, state, "it was aborted (or its lease expired)")
        handle = self._writer_handle("commit an open transaction")
        try:
            self._call("commit", lambda: _commit(handle, stamp))
        except StreamStoreError:
            if self._server_state() in ("committed", "committing"):
                self._known = "committed"
                return
            raise
        self._known = "committed"

    def abort(self) -> None:
        state = self.state()
        if state == "aborted":
            return
        if state != "open":
            raise TxnFailed(self.txn_id, state, f"it is {state}: a committed one cannot be undone")
        handle = self._client_handle()
        try:
            self._call("abort", handle.abort)
        except StreamStoreError:
            if self._server_state() != "aborted":
                raise
        self._known = "aborted"

    def state(self) -> TxnState:
        if self._known in ("committed", "aborted"):
            return self._known
        return self._server_state()

    def _server_state(self) -> TxnState:
        scope, name = self.stream.split("/")
        found = self._controller.txn_state(scope, name, self._id)
        if found == "unknown":
            raise TxnNotFound(self.txn_id)
        state = _TERMINAL.get(found, "open")
        if state in ("committed", "aborted"):
            self._known = state
        return state

    def client_handle(self) -> Any | None:
        """The client object that wrote this transaction, if this handle has it."""
        return None if self._foreign else self._handle

    def _client_handle(self) -> Any:
        if self._handle is None:
            self._handle = self._reopen(self._id)
            self._foreign = True
        return self._handle

    def _writer_handle(self, action: str) -> Any:
        """The client object that wrote this transaction's events, or `Unsupported`."""
        if self._handle is None or self._foreign:
            raise Unsupported(
                BACKEND,
                f"{action} {self.txn_id} through a handle that did not write it",
                "commit from the handle returned by begin_transaction (its commit waits for "
                "every event), or abort() this one and resend the events in a new transaction",
            )
        return self._handle


def _commit(handle: Any, stamp_ms: int | None) -> None:
    if stamp_ms is None:
        handle.commit()
    else:
        handle.commit_timestamp(stamp_ms)


def _commit_timestamp_ms(time_bounds: tuple[int, int] | None) -> int | None:
    if time_bounds is None:
        return None
    low, high = time_bounds
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high):
        msg = f"time_bounds must be (min_ns, max_ns) with 0 <= min <= max, not {time_bounds!r}"
        raise ValueError(msg)
    return high // 1_000_000
