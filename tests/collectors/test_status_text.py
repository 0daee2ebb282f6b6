"""`sluice collect status` in words: one event, two events (issue 14)."""

from __future__ import annotations

from collectors.status import InstanceStatus, format_status
from pipeline.wording import counted


def test_counts_agree_with_their_nouns():
    assert counted(0, "event") == "0 events"
    assert counted(1, "event") == "1 event"
    assert counted(2, "sample") == "2 samples"
    assert counted(100_000, "event") == "100,000 events"
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(3, "entry", "entries") == "3 entries"


def status(**counts: int) -> InstanceStatus:
    counters = {
        key: counts.get("each", 0)
        for key in ("events_buffered", "samples_committed", "events_committed", "txns_committed")
    } | {"samples_shed": counts.get("each", 0)}
    return InstanceStatus(
        name="gen",
        driver="generator",
        stream="lab/gen",
        buffer_file="/b/gen.db",
        running=True,
        sender_state="sending",
        depth_events=counts.get("each", 0),
        queued_samples=counts.get("each", 0),
        capacity_events=counts.get("capacity", 1),
        samples_read=counts.get("each", 0),
        counters=counters,
        healthy=True,
    )


def test_one_of_each_is_said_in_the_singular():
    text = format_status([status(each=1)])
    assert "  buffer: 1/1 event (1 sample waiting), /b/gen.db" in text
    assert "  read: 1 sample, buffered in 1 event" in text
    assert "  committed: 1 sample in 1 event, 1 txn; shed: 1 sample;" in text
    assert " 1 events" not in text and " 1 samples" not in text


def test_many_are_said_in_the_plural_with_thousands_separated():
    text = format_status([status(each=12_345, capacity=100_000)])
    assert "  buffer: 12,345/100,000 events (12,345 samples waiting), /b/gen.db" in text
    assert "  read: 12,345 samples, buffered in 12,345 events" in text
    assert (
        "  committed: 12,345 samples in 12,345 events, 12,345 txns; shed: 12,345 samples;" in text
    )
