"""Sealing a stream while something is still landing in it. Once `seal_stream` returns the
stream's content is final (as in Pravega): an append or a one-segment commit in flight lands
before the seal, a transaction that is `committing` (its committer alive or dead) is rolled
forward first, and an open transaction stays open and can no longer commit.

Each race is made certain by pausing the appender at its write (its segment's lock held, the
segment checked writable) until the seal, from another store handle (or another process), has
either returned or is seen waiting for that lock (`/proc/locks`)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.streams import StreamSealed, TxnFailed, open_store
from pipeline.streams.embedded.routing import key_position
from pipeline.streams.embedded.segment import SegmentFile
from pipeline.streams.embedded.transactions import EmbeddedTransaction
from tests.streams.racing import WAIT_S, Held, Run, waiting_on

pytestmark = pytest.mark.skipif(
    not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks"
)

STREAM = "race/sealed"
ROOT = Path(__file__).resolve().parents[2]
LOW, HIGH = "a", next(k for k in map(str, range(100)) if key_position(k) >= 0.5)
assert key_position(LOW) < 0.5  # of two segments, LOW routes to 0 and HIGH to 1


def until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def payloads(store) -> list[bytes]:
    return sorted(e.payload for e in store.read(STREAM))


def sealed_then_read(store) -> Callable[[], list[bytes]]:
    """Seal, then read the whole stream: what a reader sees once the seal returned."""

    def work() -> list[bytes]:
        store.seal_stream(STREAM)
        return payloads(store)

    return work


def race_seal(paused: Held, worker: Run, sealer: Run, segment: Path) -> None:
    """Start `worker` and, once it is paused at its append, `sealer`; let the worker go once
    the sealer has returned or waits for the segment's lock."""
    worker.start()
    paused.wait()
    sealer.start()
    try:
        until(lambda: not sealer.is_alive() or waiting_on(segment))
    finally:
        paused.release()


@pytest.fixture
def other(store_dir):
    """A second handle on the store: its own segment files, so its locks are `flock`s."""
    with open_store(f"embedded:{store_dir}") as s:
        yield s


def stream_with_one_event(store) -> None:
    store.create_stream(STREAM)
    with store.writer(STREAM) as w:
        w.write(b"before", LOW)


def first_segment(store_dir: Path) -> Path:
    (path,) = store_dir.glob("data/*/0.seg")
    return path


def test_an_append_in_flight_lands_before_the_seal_returns(store, other, store_dir, monkeypatch):
    stream_with_one_event(store)
    writer = store.writer(STREAM)
    writer.write(b"in flight", LOW)
    paused = Held(monkeypatch, "append", SegmentFile)
    flushing, sealing = Run(writer.flush), Run(sealed_then_read(other))
    race_seal(paused, flushing, sealing, first_segment(store_dir))
    assert flushing.outcome() == (None, None)
    seen, error = sealing.outcome()
    assert error is None, error
    assert seen == payloads(store) == [b"before", b"in flight"]
    with pytest.raises(StreamSealed):
        writer.write(b"after", LOW)
        writer.flush()


def test_an_append_in_flight_leaves_no_index_rows_once_the_stream_is_deleted(
    store, other, store_dir, monkeypatch
):
    stream_with_one_event(store)
    stream_id = int(first_segment(store_dir).parent.name)
    writer = store.writer(STREAM)
    writer.write(b"in flight", LOW)
    paused = Held(monkeypatch, "append", SegmentFile)

    def seal_and_delete() -> None:
        other.seal_stream(STREAM)
        other.delete_stream(STREAM)

    flushing, deleting = Run(writer.flush), Run(seal_and_delete)
    race_seal(paused, flushing, deleting, first_segment(store_dir))
    flushing.outcome()
    assert deleting.outcome() == (None, None)
    with sqlite3.connect(store_dir / "catalog.db") as db:
        rows = db.execute("SELECT COUNT(*) FROM blocks WHERE stream_id=?", (stream_id,))
        assert rows.fetchone() == (0,), "a block landed after the seal left its index rows"
    assert list(store_dir.glob("data/*/*.seg")) == []


def test_a_one_segment_commit_in_flight_lands_before_the_seal_returns(
    store, other, store_dir, monkeypatch
):
    stream_with_one_event(store)
    txn = store.begin_transaction(STREAM)
    txn.write(b"committed", LOW)
    paused = Held(monkeypatch, "append", SegmentFile)  # `landing` recorded
    committing, sealing = Run(txn.commit), Run(sealed_then_read(other))
    race_seal(paused, committing, sealing, first_segment(store_dir))
    assert committing.outcome() == (None, None)
    seen, error = sealing.outcome()
    assert error is None, error
    assert seen == payloads(store) == [b"before", b"committed"]
    assert txn.state() == "committed"


class Died(BaseException):
    """The committer's process ends here (nothing of it runs after)."""


def died_committing(store, monkeypatch: pytest.MonkeyPatch) -> str:
    """The id of a commit over two segments whose committer died once its first block landed:
    `committing`, one block to go."""
    store.create_stream(STREAM, segments=2)
    txn = store.begin_transaction(STREAM)
    txn.write(b"low", LOW)
    txn.write(b"high", HIGH)
    append = EmbeddedTransaction._append

    def dying(self, segment, header, body):
        if segment != 0:
            raise Died
        return append(self, segment, header, body)

    monkeypatch.setattr(EmbeddedTransaction, "_append", dying)
    with pytest.raises(Died):
        txn.commit()
    monkeypatch.undo()
    return txn.txn_id


def test_a_commit_whose_committer_died_while_committing_is_rolled_forward_by_the_seal(
    store, other, monkeypatch
):
    txn_id = died_committing(store, monkeypatch)
    assert other.get_transaction(STREAM, txn_id).state() == "committing"
    other.seal_stream(STREAM)
    seen = payloads(other)
    assert seen == [b"high", b"low"], "the decided commit was not rolled forward by the seal"
    assert other.get_transaction(STREAM, txn_id).state() == "committed"
    store.get_transaction(STREAM, txn_id).commit()  # committing again: a no-op
    assert payloads(store) == seen


def test_a_commit_rolled_forward_by_another_handle_meanwhile_lands_once(
    store, other, store_dir, monkeypatch
):
    """A roll-forward in flight (paused at its block's append, the lock held) finishes first;
    a second one, waiting, finds the block landed: it is never appended twice."""
    txn_id = died_committing(store, monkeypatch)
    paused = Held(monkeypatch, "append", SegmentFile)
    rolling = Run(store.get_transaction(STREAM, txn_id).commit)
    sealing = Run(sealed_then_read(other))
    (high_segment,) = store_dir.glob("data/*/1.seg")
    race_seal(paused, rolling, sealing, high_segment)
    assert rolling.outcome() == (None, None)
    seen, error = sealing.outcome()
    assert error is None, error
    assert seen == payloads(store) == [b"high", b"low"]


@pytest.mark.parametrize("block", [False, True], ids=["no-block", "block-landed"])
def test_a_landing_left_by_a_dead_committer_is_settled_by_the_seal(
    store, other, monkeypatch, block
):
    """Open again (no block of it: it can no longer commit) or committed (its block landed)."""
    stream_with_one_event(store)
    txn = store.begin_transaction(STREAM)
    txn.write(b"flushed", LOW)
    txn.flush()
    txn.write(b"in memory", LOW)
    land_one = EmbeddedTransaction._land_one

    def dying(self, *args, **kwargs):
        if block:
            land_one(self, *args, **kwargs)
        raise Died

    monkeypatch.setattr(EmbeddedTransaction, "_land_one", dying)
    monkeypatch.setattr(EmbeddedTransaction, "_unland", lambda self: None)  # it never runs
    with pytest.raises(Died):
        txn.commit()
    monkeypatch.undo()
    other.seal_stream(STREAM)
    landed = [b"before", b"flushed", b"in memory"] if block else [b"before"]
    assert payloads(other) == sorted(landed)
    again = other.get_transaction(STREAM, txn.txn_id)
    assert again.state() == ("committed" if block else "open")
    if not block:
        with pytest.raises(StreamSealed):
            again.commit()
        again.abort()
    assert payloads(other) == sorted(landed)


def test_an_open_transaction_stays_open_and_cannot_commit_after_the_seal(store, other):
    store.create_stream(STREAM, segments=2)
    txn = store.begin_transaction(STREAM)
    txn.write(b"low", LOW)
    txn.write(b"high", HIGH)
    txn.flush()
    other.seal_stream(STREAM)
    assert txn.state() == "open"
    with pytest.raises(StreamSealed, match=re.escape(f"stream {STREAM} is sealed")):
        txn.commit()
    assert txn.state() == "open"
    txn.abort()
    with pytest.raises(TxnFailed):
        txn.commit()
    assert payloads(other) == []


@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "in-memory"])
def test_a_commit_that_checked_before_the_seal_is_refused_after_it(
    store, other, monkeypatch, flushed
):
    """The committer checked the stream writable, and reaches its segment's lock only once the
    seal has returned: `StreamSealed`, never a crash; nothing of it landed, and it can still
    be aborted."""
    stream_with_one_event(store)
    txn = store.begin_transaction(STREAM)
    txn.write(b"in the transaction", LOW)
    if flushed:
        txn.flush()
    paused = Held(monkeypatch, "locked", SegmentFile)
    committing = Run(txn.commit)
    committing.start()
    paused.wait()
    other.seal_stream(STREAM)
    paused.release()
    _, error = committing.outcome()
    assert isinstance(error, StreamSealed), repr(error)
    assert re.search(re.escape(f"stream {STREAM} is sealed"), str(error))
    assert txn.state() == "open"
    assert payloads(other) == [b"before"]
    txn.abort()


def test_a_scale_that_raced_the_seal_leaves_every_segment_sealed(store, other, monkeypatch):
    """The seal listed the active segments before a scale replaced them: it seals the new
    ones too, under their locks."""
    store.create_stream(STREAM)
    paused = Held(monkeypatch, "locked", SegmentFile)
    sealing = Run(lambda: other.seal_stream(STREAM))
    sealing.start()
    paused.wait()
    store.scale(STREAM, [0], [(0.0, 0.5), (0.5, 1.0)])
    paused.release()
    assert sealing.outcome() == (None, None)
    info = store.info(STREAM)
    assert info.sealed and all(s.sealed for s in info.segments)
    assert [s.segment for s in info.segments] == [0, 1, 2]


SEAL_AND_READ = """
import json, sys
from pipeline.streams import open_store
with open_store(sys.argv[1]) as store:
    store.seal_stream(sys.argv[2])
    print(json.dumps(sorted(e.payload.decode() for e in store.read(sys.argv[2]))))
"""


def test_a_seal_from_another_process_waits_for_the_append_in_flight(store, store_dir, monkeypatch):
    stream_with_one_event(store)
    writer = store.writer(STREAM)
    writer.write(b"in flight", LOW)
    paused = Held(monkeypatch, "append", SegmentFile)
    flushing = Run(writer.flush)
    flushing.start()
    paused.wait()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", SEAL_AND_READ, f"embedded:{store_dir}", STREAM]
    sealer = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        until(lambda: sealer.poll() is not None or waiting_on(first_segment(store_dir)))
    finally:
        paused.release()
    out, err = sealer.communicate(timeout=WAIT_S)
    assert sealer.returncode == 0, err.decode()
    assert flushing.outcome() == (None, None)
    assert json.loads(out) == [p.decode() for p in payloads(store)] == ["before", "in flight"]
