"""A writer process for the store crash tests; killed with SIGKILL at random points.

    python store_worker.py STORE_DIR STREAM NAME append|txn|txn-unflushed STATE_DIR

It writes events "NAME:SEQ:<filler>" with routing key NAME, forever. After each durable write
it records the highest acknowledged sequence number in STATE_DIR/NAME.acked (fsynced), so the
test knows what the store acknowledged. On start it resumes after the acknowledged number:
- append mode resends with writer id NAME and event number SEQ (the store drops duplicates);
- txn mode records the flushed transaction id in NAME.pending before committing, and on
  start commits a recorded id again (the collector's two-phase commit, in miniature);
- txn-unflushed mode commits straight from memory (no flush: a one-segment commit lands its
  block in one synced write) and records the id before committing; on start the store's
  `state()` of a recorded id decides: committed, its events are acknowledged; open, it is
  aborted and its events are sent again in a new transaction.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.durable import write_text
from pipeline.streams import open_store

BATCH = 7


def payload(name: str, seq: int) -> bytes:
    filler = (f"{seq:08d}" * (1 + seq % 97)).encode()
    return f"{name}:{seq}:".encode() + filler


def read_state(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def main() -> None:
    store_dir, stream, name, mode, state_dir = sys.argv[1:6]
    state = Path(state_dir)
    acked_file, pending_file = state / f"{name}.acked", state / f"{name}.pending"
    store = open_store(f"embedded:{store_dir}")
    acked = int(read_state(acked_file) or 0)
    if mode.startswith("txn") and (pending := read_state(pending_file)):
        txn_id, last = pending.split()
        txn = store.get_transaction(stream, txn_id)
        if mode == "txn" or txn.state() == "committed":
            txn.commit()
            acked = int(last)
            write_text(acked_file, str(acked))
        else:
            txn.abort()  # open: nothing of it is visible, nor will be
        pending_file.unlink()
    writer = store.writer(stream, writer_id=name) if mode == "append" else None
    seq = acked
    while True:
        batch = range(seq + 1, seq + 1 + BATCH)
        if writer is not None:
            for n in batch:
                writer.write(payload(name, n), routing_key=name, event_number=n)
            writer.flush()
        else:
            txn = store.begin_transaction(stream)
            for n in batch:
                txn.write(payload(name, n), routing_key=name)
            if mode == "txn":
                txn.flush()
            write_text(pending_file, f"{txn.txn_id} {batch[-1]}")
            txn.commit(time_bounds=(batch[0], batch[-1]))
        seq = batch[-1]
        write_text(acked_file, str(seq))
        if writer is None:
            pending_file.unlink()  # only after the ack is recorded: else a kill here resends


if __name__ == "__main__":
    main()
