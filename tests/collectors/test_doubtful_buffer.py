"""Doubtful rows in a real buffer file: how they are counted, dropped and sent again."""

from __future__ import annotations

import re

import pytest

from collectors.buffer import Appended, Buffer
from collectors.buffer.schema import PendingEvent
from collectors.errors import BufferCorrupt


def pending(n: int, start: int = 0) -> list[PendingEvent]:
    return [PendingEvent(f"e{i}".encode(), "k", i, i, 1) for i in range(start, start + n)]


def doubtful_then_sent(buffer: Buffer) -> None:
    """5 events go doubtful (their transaction unknown to the store), then 20 more are
    buffered and sent: the doubtful rows stay at the head of the ids."""
    buffer.append(pending(5))
    batch = buffer.next_batch(5, 1 << 20)
    record = buffer.ledger.record_open("lost", "s/t", batch=batch)
    buffer.ledger.mark_doubtful(record, "unknown to the store")
    for start in range(5, 25, 5):
        assert buffer.append(pending(5, start)) is Appended.STORED
        batch = buffer.next_batch(5, 1 << 20)
        buffer.ledger.forget(buffer.ledger.record_open(f"sent-{start}", "s/t", batch=batch))


def test_doubtful_rows_take_only_their_own_room(tmp_path):
    buffer = Buffer(tmp_path / "b.db", capacity_events=10, when_full="shed")
    doubtful_then_sent(buffer)
    assert buffer.held().doubtful == 5 and buffer.held().pending == 0
    assert buffer.depth() == 5
    # Room for 5 more (counting the ids from the doubtful ones, it had room for 1 at most).
    for i in range(5):
        assert buffer.append(pending(1, 100 + i)) is Appended.STORED
    assert buffer.depth() == 10 and buffer.held().pending == 5
    buffer.close()


def test_resend_moves_doubtful_rows_to_the_tail_in_order(tmp_path):
    buffer = Buffer(tmp_path / "b.db", capacity_events=100)
    doubtful_then_sent(buffer)
    buffer.append(pending(2, 50))
    (record,) = buffer.ledger.doubtful()
    buffer.ledger.resend_doubtful(record)
    assert buffer.ledger.txns() == []
    batch = buffer.next_batch(100, 1 << 20)
    assert [e.payload for e in batch] == [b"e50", b"e51", b"e0", b"e1", b"e2", b"e3", b"e4"]
    assert buffer.held().pending == 7 and buffer.counters()["doubtful_resent"] == 5
    with pytest.raises(BufferCorrupt, match=re.escape("is not a doubtful record")):
        buffer.ledger.resend_doubtful(record)  # settled once only
    buffer.close()


def test_drop_deletes_doubtful_rows_and_their_record(tmp_path):
    buffer = Buffer(tmp_path / "b.db", capacity_events=100)
    doubtful_then_sent(buffer)
    (record,) = buffer.ledger.doubtful()
    assert [e.payload for e in buffer.ledger.rows(record)] == [f"e{i}".encode() for i in range(5)]
    buffer.ledger.drop_doubtful(record)
    assert buffer.ledger.txns() == [] and buffer.depth() == 0
    assert buffer.counters()["doubtful_dropped"] == 5
    buffer.close()
