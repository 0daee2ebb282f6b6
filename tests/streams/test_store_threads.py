"""Threads of one process sharing one embedded store: a stream deleted, or the store closed, by
one thread while another reads or writes it. The one in flight finishes on the file it started
on (never on a descriptor number reused by another file); the next use raises the typed error
(`StreamNotFound`, `StoreUnavailable`); no deleted segment file comes back. A transaction
flushed while another thread aborts it is refused and leaves no body file behind.

Each race is made certain by holding the reader's or writer's system call (its descriptor
already taken) until the other thread has done its part."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.streams import StoreUnavailable, StreamNotFound, TxnFailed
from pipeline.streams.embedded.transactions import EmbeddedTransaction
from tests.streams.racing import Held, Run

STREAM = "threads/s"
EVENT = 1000
PER_BLOCK = 600  # two blocks of ~600 KB: two runs of a read (`reading.RUN_BYTES`)


def write_two_blocks(store) -> list[bytes]:
    store.create_stream(STREAM)
    written = []
    for block in range(2):
        with store.writer(STREAM) as w:
            for i in range(PER_BLOCK):
                payload = f"{block}.{i}.".encode().ljust(EVENT, b"x")
                w.write(payload, routing_key="k")
                written.append(payload)
    return written


def segment_files(store_dir: Path) -> list[Path]:
    return sorted((store_dir / "data").glob("*/*.seg"))


def raced(
    held: Held, worker: Run, tmp_path: Path, meanwhile: Callable[[], object]
) -> BaseException | None:
    """Start `worker`, and once it waits at its held system call do `meanwhile`, then open a
    decoy file (it takes the lowest free descriptor number: any that `meanwhile` freed) and
    let the worker go. The decoy is left untouched; the worker's error, if any."""
    worker.start()
    held.wait()
    try:
        meanwhile()
    except BaseException:
        held.release()  # not left waiting into the next test
        raise
    path = tmp_path / "decoy.bin"
    path.write_bytes(bytes(2 << 20))
    fd = os.open(path, os.O_RDWR)
    try:
        held.release()
        _, error = worker.outcome()
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(2 << 20), "the one in flight used another file's descriptor"
    return error


def delete(store) -> None:
    store.seal_stream(STREAM)
    store.delete_stream(STREAM)


def open_deleted_files() -> list[str]:
    """Descriptors of this process still open on a deleted segment file."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".seg (deleted)"):
            found.append(target)
    return found


def read_all(store) -> Callable[[], list[bytes]]:
    def work() -> list[bytes]:
        got: list[bytes] = []
        try:
            for event in store.read_segment(STREAM, 0, 0):
                got.append(event.payload)
        except BaseException as exc:
            exc.got = got  # the events delivered before it
            raise
        return got

    return work


def test_a_read_raced_by_a_delete_never_reads_another_files_bytes(
    store, store_dir, tmp_path, monkeypatch
):
    written = write_two_blocks(store)
    held = Held(monkeypatch, "preadv")  # the read of the first run
    error = raced(held, Run(read_all(store)), tmp_path, lambda: delete(store))
    assert isinstance(error, StreamNotFound), error
    assert error.got == written[:PER_BLOCK], "the run in flight read the stream's own bytes"
    assert segment_files(store_dir) == []
    assert open_deleted_files() == [], "closed once the read in flight was done"


def test_a_read_resumed_after_its_stream_was_deleted_raises_stream_not_found(store, store_dir):
    written = write_two_blocks(store)
    events = store.read_segment(STREAM, 0, 0)
    first = next(events)
    delete(store)
    got = [first.payload]
    with pytest.raises(StreamNotFound):
        got += [e.payload for e in events]
    assert got == written[: len(got)]
    assert segment_files(store_dir) == [], "the reader did not create the file again"
    with sqlite3.connect(store_dir / "catalog.db") as db:
        assert db.execute("SELECT * FROM damage").fetchall() == []


def test_a_read_that_starts_after_the_delete_creates_no_file(store, store_dir):
    write_two_blocks(store)
    events = store.read_segment(STREAM, 0, 0)  # checked now, read from the first `next`
    delete(store)
    with pytest.raises(StreamNotFound):
        next(events)
    assert segment_files(store_dir) == []


def test_an_append_in_flight_lands_before_a_delete_on_another_thread(
    store, store_dir, tmp_path, monkeypatch
):
    """The seal before the delete waits for the append (it takes the segment's lock), so the
    append finishes on its own file, and the delete then removes it."""
    store.create_stream(STREAM)
    held = Held(monkeypatch, "pwritev")
    writer = store.writer(STREAM)
    writer.write(b"in flight".ljust(EVENT, b"x"), routing_key="k")
    deleting = Run(lambda: delete(store))

    def meanwhile() -> None:
        deleting.start()
        deleting.join(0.2)
        assert deleting.is_alive(), "the seal did not wait for the append in flight"

    # held once the writer checked, under the segment's lock, that it may append
    error = raced(held, Run(writer.flush), tmp_path, meanwhile)
    assert error is None, error
    assert deleting.outcome() == (None, None)
    assert segment_files(store_dir) == [], "unlocking did not create the file again"
    assert open_deleted_files() == []
    with pytest.raises(StreamNotFound):
        store.writer(STREAM)


def test_a_read_raced_by_close_raises_store_unavailable(store, tmp_path, monkeypatch):
    written = write_two_blocks(store)
    held = Held(monkeypatch, "preadv")
    error = raced(held, Run(read_all(store)), tmp_path, store.close)
    assert isinstance(error, StoreUnavailable), error
    assert error.got == written[:PER_BLOCK]
    assert open_deleted_files() == []


def test_a_closed_store_refuses_with_store_unavailable(store, store_dir):
    store.create_stream(STREAM)
    store.close()
    with pytest.raises(StoreUnavailable, match="was closed"):
        store.list_streams()
    with pytest.raises(StoreUnavailable, match="was closed"):
        store.create_stream("threads/other")


def test_a_flush_raced_by_an_abort_is_refused_and_leaves_no_body(store, store_dir, monkeypatch):
    """Another thread aborts the transaction after this flush checked that it is open."""
    store.create_stream(STREAM)
    txn = store.begin_transaction(STREAM)
    txn.write(b"late", routing_key="k")
    write_pending = EmbeddedTransaction._write_pending

    def aborted_first(self):
        aborting = Run(store.get_transaction(STREAM, self.txn_id).abort)
        aborting.start()
        assert aborting.outcome() == (None, None)
        return write_pending(self)

    monkeypatch.setattr(EmbeddedTransaction, "_write_pending", aborted_first)
    with pytest.raises(TxnFailed, match="aborted"):
        txn.flush()
    assert list((store_dir / "txn").glob("*.body")) == []
    assert store.get_transaction(STREAM, txn.txn_id).state() == "aborted"
