"""The embedded store's transaction commit: what it syncs, and what a power cut can take from it.

A power cut is played by putting the catalog back as it was before some step (the catalog
writes made with synchronous=NORMAL since then never reached the disk) while the fsynced data
files stay. Kill -9 at each step of a commit: tests/reliability/test_store_crash.py.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from pipeline.streams import TxnFailed, TxnNotFound, open_store

STREAM = "txn/s"


def snapshot(store_dir: Path, into: Path) -> None:
    """Copy the closed store's catalog (every change in it is on disk)."""
    into.mkdir()
    for path in store_dir.glob("catalog.db*"):
        shutil.copyfile(path, into / path.name)


def power_cut(store_dir: Path, saved: Path) -> None:
    """Put the catalog back as `snapshot` saved it: what was written to it since is lost."""
    for path in store_dir.glob("catalog.db*"):
        path.unlink()
    for path in saved.iterdir():
        shutil.copyfile(path, store_dir / path.name)


@pytest.fixture
def before_begin(store_dir, tmp_path) -> Path:
    """A store with a two-segment stream, its catalog saved before any transaction began."""
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(STREAM, segments=2)
    saved = tmp_path / "before-begin"
    snapshot(store_dir, saved)
    return saved


def count_syncs(store, monkeypatch) -> dict[str, int]:
    """Count `os.fsync`/`os.fdatasync` calls and COMMITs of the synchronous=FULL catalog
    connection (each syncs the write-ahead log) from now on."""
    counts = {"files": 0, "catalog": 0}
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counted(fd, real=real):
            counts["files"] += 1
            return real(fd)

        monkeypatch.setattr(os, name, counted)

    def on_statement(sql: str) -> None:
        counts["catalog"] += sql.strip().upper() == "COMMIT"

    store._engine.catalog.meta.set_trace_callback(on_statement)
    return counts


def test_a_one_segment_transaction_costs_one_sync(store, monkeypatch):
    store.create_stream(STREAM, segments=2)
    store.begin_transaction(STREAM).commit()  # creates nothing, but opens the catalog's paths
    with store.writer(STREAM) as w:  # the segment file and its directories exist
        w.write(b"first", routing_key="k")
    counts = count_syncs(store, monkeypatch)
    txn = store.begin_transaction(STREAM)
    txn.write(b"a" * 65536, routing_key="k")
    txn.write(b"b", routing_key="k")
    txn.commit()
    assert counts == {"files": 1, "catalog": 0}, "the block's fdatasync, nothing else"
    assert [e.payload for e in store.read(STREAM)] == [b"first", b"a" * 65536, b"b"]
    assert txn.state() == "committed"


def test_a_flushed_transaction_lands_its_body_and_the_rest_in_one_block(store, store_dir):
    store.create_stream(STREAM, segments=2)
    txn = store.begin_transaction(STREAM)
    for i in range(3):
        txn.write(f"f{i}".encode(), routing_key="k")
    txn.flush()
    txn.write(b"late", routing_key="k")
    txn.commit()
    events = list(store.read(STREAM))
    assert [e.payload for e in events] == [b"f0", b"f1", b"f2", b"late"]
    assert len({e.ingest_time_ns for e in events}) == 1, "one block, one ingest time"
    assert not list((store_dir / "txn").glob(f"{txn.txn_id}.*")), "its body is removed"
    assert store.verify().ok


def test_a_transaction_over_two_segments_still_commits_atomically(store):
    store.create_stream(STREAM, segments=2)
    keys = [f"k{i}" for i in range(40)]
    txn = store.begin_transaction(STREAM)
    for key in keys:
        txn.write(key.encode(), routing_key=key)
    txn.commit()
    assert sorted(e.payload for e in store.read(STREAM)) == sorted(k.encode() for k in keys)
    assert len({e.segment for e in store.read(STREAM)}) == 2
    assert txn.state() == "committed"


def test_events_written_after_a_commit_are_refused_not_dropped(store_dir, before_begin):
    """A one-segment commit whose `committed` a power cut lost is found committed; events
    written into it since cannot join it, and say so."""
    with open_store(f"embedded:{store_dir}") as other:
        txn = other.begin_transaction(STREAM)
        txn.write(b"e", routing_key="k")
        txn.flush()
        saved = before_begin.parent / "flushed"
        other.close()
        snapshot(store_dir, saved)
    with open_store(f"embedded:{store_dir}") as other:
        other.get_transaction(STREAM, txn.txn_id).commit()
    power_cut(store_dir, saved)  # the catalog says open; the block is in the segment
    with open_store(f"embedded:{store_dir}") as again:
        late = again.get_transaction(STREAM, txn.txn_id)
        late.write(b"late", routing_key="k")
        with pytest.raises(TxnFailed, match=re.escape("the events written since cannot join")):
            late.commit()
        assert [e.payload for e in again.read(STREAM)] == [b"e"]


def test_a_begin_lost_in_a_power_cut_is_open_again(store_dir, before_begin):
    """A transaction the catalog has no row of (a begin records none; a power cut can lose a
    row written with synchronous=NORMAL) is found open from its id, in any process."""
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.begin_transaction(STREAM)
    power_cut(store_dir, before_begin)
    with open_store(f"embedded:{store_dir}") as store:
        again = store.get_transaction(STREAM, txn.txn_id)
        assert again.state() == "open"
        again.write(b"after the cut", routing_key="k")
        again.commit()
        assert again.state() == "committed"
        assert [e.payload for e in store.read(STREAM)] == [b"after the cut"]


def test_a_lost_begin_keeps_its_lease(store_dir, before_begin):
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.begin_transaction(STREAM, lease_seconds=0.001)
    power_cut(store_dir, before_begin)
    with open_store(f"embedded:{store_dir}") as store:
        again = store.get_transaction(STREAM, txn.txn_id)
        again.write(b"too late", routing_key="k")
        with pytest.raises(TxnFailed, match="lease expired"):
            again.commit()
        assert again.state() == "aborted"


def test_a_flush_cut_short_leaves_the_lost_begin_open_and_empty(store_dir, before_begin):
    """The body was fsynced, the power went before its length was recorded (FULL): the
    transaction is open again, and the unrecorded bytes count for nothing."""
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.begin_transaction(STREAM)
        txn.write(b"never acknowledged", routing_key="k")
        txn.flush()
    power_cut(store_dir, before_begin)
    with open_store(f"embedded:{store_dir}") as store:
        again = store.get_transaction(STREAM, txn.txn_id)
        assert again.state() == "open"
        again.write(b"resent", routing_key="k")
        again.flush()
        again.commit()
        assert [e.payload for e in store.read(STREAM)] == [b"resent"]


def test_a_flushed_transaction_lost_with_the_catalog_is_recovered_with_its_events(store_dir):
    """A catalog rebuilt by `repair` recovers a transaction this store issued from its flushed
    body: open, with its events (never reopened empty), so that its writer commits it; one
    only begun (nothing flushed, nothing durable) is not found."""
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(STREAM)
        txn = store.begin_transaction(STREAM)
        txn.write(b"flushed", routing_key="k")
        txn.flush()
        begun = store.begin_transaction(STREAM)
    for path in store_dir.glob("catalog.db*"):
        path.unlink()
    with open_store(f"embedded:{store_dir}") as store:
        report = store.repair()
        assert any(txn.txn_id in p.what and "recovered" in p.what for p in report.fixed)
        with pytest.raises(TxnNotFound):
            store.get_transaction(STREAM, begun.txn_id)
        recovered = store.get_transaction(STREAM, txn.txn_id)
        assert recovered.state() == "open"
        recovered.commit()
        assert [(e.routing_key, e.payload) for e in store.read(STREAM)] == [("k", b"flushed")]


def test_ids_of_another_stream_or_store_or_altered_are_not_found(store_dir, tmp_path):
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(STREAM)
        store.create_stream("txn/other")
        txn_id = store.begin_transaction(STREAM).txn_id
        altered = txn_id[:40] + ("0" if txn_id[40] != "0" else "1") + txn_id[41:]
        for stream, wrong in (("txn/other", txn_id), (STREAM, altered), (STREAM, txn_id[:32])):
            with pytest.raises(TxnNotFound):
                store.get_transaction(stream, wrong)
    with open_store(f"embedded:{tmp_path / 'elsewhere'}") as elsewhere:
        elsewhere.create_stream(STREAM)
        with pytest.raises(TxnNotFound):
            elsewhere.get_transaction(STREAM, txn_id)


def test_a_power_cut_after_a_commit_keeps_it_committed(store_dir, before_begin):
    """The catalog goes back to before the begin; the fsynced block stays and is the commit."""
    with open_store(f"embedded:{store_dir}") as store:
        txn = store.begin_transaction(STREAM)
        txn.write(b"kept", routing_key="k")
        txn.commit()
    power_cut(store_dir, before_begin)
    with open_store(f"embedded:{store_dir}") as store:
        again = store.get_transaction(STREAM, txn.txn_id)
        assert again.state() == "committed"
        with pytest.raises(TxnFailed, match="already committed"):
            again.abort()
        again.commit()
        assert [e.payload for e in store.read(STREAM)] == [b"kept"]
        assert store.verify().ok


def test_blocks_of_more_events_than_one_write_takes(store):
    """A block of more events than `pwritev` takes buffers (IOV_MAX, 1024 on Linux) is written
    in several calls: a writer's flush and a one-segment commit from memory."""
    store.create_stream(STREAM)
    with store.writer(STREAM) as w:
        for i in range(3000):
            w.write(f"w{i}".encode(), routing_key="k")
    txn = store.begin_transaction(STREAM)
    for i in range(3000):
        txn.write(f"t{i}".encode(), routing_key="k")
    txn.commit()
    payloads = [e.payload for e in store.read(STREAM)]
    assert payloads == [f"w{i}".encode() for i in range(3000)] + [
        f"t{i}".encode() for i in range(3000)
    ]
    assert store.verify().ok


def test_a_transaction_with_no_row_yet_is_shared_by_id(store_dir):
    """A begin records nothing: another handle finds the transaction by id, open, and an abort
    there is final for the handle that began it."""
    with open_store(f"embedded:{store_dir}") as first, open_store(f"embedded:{store_dir}") as other:
        first.create_stream(STREAM)
        txn = first.begin_transaction(STREAM)
        txn.write(b"never", routing_key="k")
        found = other.get_transaction(STREAM, txn.txn_id)
        assert found.state() == "open"
        found.abort()
        with pytest.raises(TxnFailed, match="it was aborted"):
            txn.commit()
        assert txn.state() == "aborted"
        assert list(first.read(STREAM)) == []


@pytest.mark.parametrize(
    "bounds", [(5, 1), (1.5, 2), (1, 2**63), (-(2**63), 0), (True, 2), (1, 2, 3), ("1", "2")]
)
def test_time_bounds_that_are_no_window_are_refused_at_the_commit(store, bounds):
    """Bounds given max-first hid the transaction's events from any time window between
    them (a slice's cuts missed them); the store now refuses them, and the transaction stays
    open for a commit with good ones."""
    import numpy as np

    from pipeline.streams import InvalidArgument

    store.create_stream("t/bounds")
    txn = store.begin_transaction("t/bounds")
    txn.write(b"x")
    txn.flush()
    with pytest.raises(InvalidArgument, match=re.escape(f"invalid time_bounds {bounds!r}: ")):
        txn.commit(time_bounds=bounds)
    txn.commit(time_bounds=(np.int64(-5), np.int64(7)))  # numpy's whole numbers are fine
    start, end = store.time_cuts("t/bounds", -5, 8)
    assert [e.payload for e in store.read("t/bounds", start, end)] == [b"x"]
