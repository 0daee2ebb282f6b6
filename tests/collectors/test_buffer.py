"""The SQLite buffer: order, capacity (block / shed), cursors, transaction records, schema."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from collectors.buffer import Appended, Buffer
from collectors.buffer.schema import CursorState, PendingEvent
from collectors.errors import BufferCorrupt, BufferSchemaError
from pipeline.streams import MAX_EVENT_SIZE, EventTooLarge


def ev(i: int, samples: int = 10) -> PendingEvent:
    return PendingEvent(f"event-{i}".encode(), "key", 1000 + i, 2000 + i, samples)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "buffer.db"


def test_events_come_back_in_order_in_bounded_batches(path):
    buffer = Buffer(path, capacity_events=100)
    assert buffer.append([ev(i) for i in range(10)]) is Appended.STORED
    batch = buffer.next_batch(max_events=4, max_bytes=10_000)
    assert [e.payload for e in batch] == [f"event-{i}".encode() for i in range(4)]
    assert [e.id for e in batch] == [1, 2, 3, 4]
    by_bytes = buffer.next_batch(max_events=100, max_bytes=len(b"event-0") * 3)
    assert len(by_bytes) == 3
    one = buffer.next_batch(max_events=100, max_bytes=1)
    assert len(one) == 1  # never an empty batch because of the byte limit
    assert buffer.counters()["samples_buffered"] == 100


def test_the_two_phase_records_move_the_queue_and_forget_drops_rows(path):
    buffer = Buffer(path, capacity_events=100)
    buffer.append([ev(i) for i in range(5)])
    batch = buffer.next_batch(3, 10_000)
    buffer.ledger.record_open("t1", "s/x")
    assert buffer.next_batch(10, 10_000)[0].id == 1  # open promises nothing yet
    record = buffer.ledger.mark_ready("t1", "s/x", batch)
    assert (record.first_id, record.last_id, record.events, record.samples) == (1, 3, 3, 30)
    assert record.time_bounds == (1000, 2002)
    assert [e.id for e in buffer.next_batch(10, 10_000)] == [4, 5]
    assert buffer.depth() == 5 and buffer.queued() == 2
    # a second connection (another thread or a restart) sees the same queue position
    other = Buffer(path, capacity_events=100)
    assert [e.id for e in other.next_batch(10, 10_000)] == [4, 5]
    buffer.ledger.forget(record)
    assert buffer.depth() == 2 and buffer.ledger.txns() == []
    assert buffer.meta()["last_committed_ns"] == "2002"
    assert buffer.counters()["samples_committed"] == 30


def test_requeue_puts_an_aborted_batch_back_at_the_head(path):
    buffer = Buffer(path, capacity_events=100)
    buffer.append([ev(i) for i in range(4)])
    buffer.ledger.record_open("t1", "s/x")
    record = buffer.ledger.mark_ready("t1", "s/x", buffer.next_batch(2, 10_000))
    buffer.ledger.requeue(record)
    assert [e.id for e in buffer.next_batch(10, 10_000)] == [1, 2, 3, 4]
    assert buffer.counters()["txns_requeued"] == 1


def test_mark_ready_refuses_a_batch_that_overlaps_a_promised_one(path):
    buffer = Buffer(path, capacity_events=100)
    buffer.append([ev(i) for i in range(4)])
    batch = buffer.next_batch(2, 10_000)
    buffer.ledger.record_open("t1", "s/x")
    buffer.ledger.mark_ready("t1", "s/x", batch)
    buffer.ledger.record_open("t2", "s/x")
    with pytest.raises(BufferCorrupt, match="overlaps a promised range"):
        buffer.ledger.mark_ready("t2", "s/x", batch)
    with pytest.raises(BufferCorrupt, match=re.escape("transaction t3 is not recorded as open")):
        buffer.ledger.mark_ready("t3", "s/x", buffer.next_batch(2, 10_000))


def test_cursor_is_stored_with_the_events_or_not_at_all(path):
    buffer = Buffer(path, capacity_events=100)
    buffer.append([ev(0)], cursor=CursorState("gen", 1, {"next_seq": 10}))
    assert buffer.cursor("gen").value == {"next_seq": 10}

    def failing_hook(c):
        msg = "driver SQL failed"
        raise RuntimeError(msg)

    with pytest.raises(RuntimeError):
        buffer.append([ev(1)], cursor=CursorState("gen", 1, {"next_seq": 20}), hook=failing_hook)
    assert buffer.cursor("gen").value == {"next_seq": 10}
    assert buffer.depth() == 1


def test_shed_policy_drops_new_events_and_counts_them(path):
    buffer = Buffer(path, capacity_events=3, when_full="shed")
    assert buffer.append([ev(0), ev(1), ev(2)]) is Appended.STORED
    assert buffer.append([ev(3)]) is Appended.SHED
    assert buffer.append([ev(4)]) is Appended.SHED
    buffer.flush_counters()
    counters = buffer.counters()
    assert (counters["events_shed"], counters["samples_shed"]) == (2, 20)
    assert [e.payload for e in buffer.next_batch(10, 10_000)][-1] == b"event-2"


def test_block_policy_waits_for_room_and_gives_up_on_stop(path):
    room = threading.Condition()
    driver = Buffer(path, capacity_events=2, when_full="block", room=room)
    sender = Buffer(path, capacity_events=2, room=room)
    driver.append([ev(0), ev(1)])
    results: list[Appended] = []
    thread = threading.Thread(target=lambda: results.append(driver.append([ev(2)])))
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive() and not results  # blocked, nothing lost, nothing stored
    sender.ledger.record_open("t1", "s/x")
    sender.ledger.forget(sender.ledger.mark_ready("t1", "s/x", sender.next_batch(1, 10_000)))
    thread.join(5)
    assert results == [Appended.STORED]
    assert driver.counters()["blocked_ms"] >= 400

    stop = threading.Event()
    stop.set()
    assert driver.append([ev(3)], stop=stop) is Appended.STOPPED
    assert driver.depth() == 2


def test_events_over_the_store_limit_are_refused_before_buffering(path):
    buffer = Buffer(path, capacity_events=10)
    big = PendingEvent(b"x" * (MAX_EVENT_SIZE + 1), None, 0, 0, 1)
    with pytest.raises(EventTooLarge):
        buffer.append([ev(0), big])
    assert buffer.depth() == 0


def test_a_buffer_from_a_newer_collector_is_refused(path):
    Buffer(path, 10).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(BufferSchemaError, match="schema version 99, this collector reads up to 1"):
        Buffer(path, 10)


def test_errors_are_kept_for_status_and_trimmed(path):
    buffer = Buffer(path, 10)
    for i in range(60):
        buffer.record_error("sender", f"problem {i}")
    rows = buffer.conn.execute("SELECT message FROM errors ORDER BY id").fetchall()
    assert len(rows) == 50 and rows[-1][0] == "problem 59"
    assert buffer.counters()["errors"] == 60


def test_a_batch_larger_than_the_capacity_is_refused_not_blocked_forever(path):
    buffer = Buffer(path, capacity_events=3)
    with pytest.raises(ValueError, match=re.escape("4 events can never fit a buffer of 3")):
        buffer.append([ev(i) for i in range(4)])


def test_two_connections_opening_a_new_buffer_at_once_both_succeed(tmp_path):
    """The collector creating its buffer while `collect status` opens it: switching a new
    file to WAL locks it, and neither side may take that for "not a SQLite database"."""
    import threading

    from collectors.buffer.file import connect

    for attempt in range(30):
        path = tmp_path / f"race-{attempt}.db"
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def open_it(path=path, errors=errors, start=start) -> None:
            start.wait()
            try:
                connect(path).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_it) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []


def test_another_process_closing_the_buffer_leaves_the_collectors_log_in_place(path):
    # the driver's and the sender's connections, as a running collector holds them; opening
    # the second once dropped the process's locks, so `collect status` closing its own
    # connection deleted the write-ahead log both were still writing to ("malformed" later)
    driver = Buffer(path, capacity_events=1000)
    sender = Buffer(path, capacity_events=1000, turns=driver.turns, room=driver.room)
    driver.append([ev(i) for i in range(10)])
    status = "import sys, pathlib, collectors.buffer as b; b.connect(pathlib.Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", status, str(path)], check=True)
    assert path.with_name(path.name + "-wal").exists()
    driver.append([ev(i) for i in range(10, 20)])
    assert [e.payload for e in sender.next_batch(100, 100_000)] == [
        f"event-{i}".encode() for i in range(20)
    ]
    driver.close()
    sender.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert check.execute("SELECT count(*) FROM events").fetchone() == (20,)
