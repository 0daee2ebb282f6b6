"""The embedded store never serves a damaged byte, contains damage, refuses bad input with a
typed error, and survives a lost catalog (issue 11). Random damage at scale:
tests/reliability/test_damage.py."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from pipeline.streams import InvalidCut, Problem, StreamCut, open_store
from pipeline.streams.errors import (
    MAX_EVENT_NUMBER,
    CatalogDamaged,
    CatalogMismatch,
    Corrupted,
    InvalidEventNumber,
    SegmentDamaged,
    TxnFailed,
)


def segment_path(store_dir: Path, stream: str, segment: int) -> Path:
    """A stream's segment file, found through the manifests beside the data."""
    for manifest in (store_dir / "data").glob("*/stream.json"):
        found = json.loads(manifest.read_text())
        if f"{found['scope']}/{found['name']}" == stream and not found["deleted"]:
            return manifest.parent / f"{segment}.seg"
    msg = f"no manifest for {stream}"
    raise AssertionError(msg)


def flip(path: Path, offset: int) -> None:
    with path.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x5A]))


def write_blocks(
    store, stream: str, blocks: int, per_block: int = 5, key: str = "k"
) -> list[bytes]:
    """`blocks` flushes of `per_block` events each, all with one routing key."""
    written = []
    with store.writer(stream) as w:
        for b in range(blocks):
            for i in range(per_block):
                payload = f"{stream}:{b}:{i}:".encode() + b"x" * 40
                w.write(payload, routing_key=key)
                written.append(payload)
            w.flush()
    return written


def payloads(events) -> list[bytes]:
    return [e.payload for e in events]


# --- every read path checks what it returns ------------------------------------------------


def test_a_flipped_payload_byte_is_never_served(store, store_dir):
    store.create_stream("d/s")
    written = write_blocks(store, "d/s", blocks=4)
    third = [e for e in store.read("d/s")][10]  # the first event of the third block
    flip(segment_path(store_dir, "d/s", 0), third.offset + 80)
    got = []
    with pytest.raises(Corrupted, match=re.escape("sluice store repair")) as caught:
        got.extend(store.read("d/s"))
    assert got == [e for e in got if e.offset < third.offset]
    assert payloads(got) == written[:10], "the events before the damage are delivered"
    error = caught.value
    assert (error.stream, error.segment, error.offset) == ("d/s", 0, third.offset)
    assert "checksum mismatch" in error.problem
    assert vars(pickle.loads(pickle.dumps(error))) == vars(error)
    with pytest.raises(Corrupted):
        list(store.read_segment("d/s", 0, third.offset))
    reader = store.reader_group("rg", "d/s").reader("r")
    with pytest.raises(Corrupted):
        reader.read(1000)


def test_a_large_block_read_in_pieces_is_checked_again_at_every_read(store, store_dir):
    """The frames of a block of many events are parsed once and kept for the next read of a
    few of its events; each read still verifies the block's bytes: damage done in between is
    found, never served from what an earlier read parsed."""
    store.create_stream("d/big")
    written = write_blocks(store, "d/big", blocks=2, per_block=300)
    events = list(store.read("d/big"))
    cut = {i: StreamCut.of("d", "big", {0: events[i].offset}) for i in (10, 20, 310, 320)}
    for _ in range(2):  # the second time from the frames the first time parsed
        assert payloads(store.read("d/big", cut[10], cut[20])) == written[10:20]
        assert payloads(store.read("d/big", cut[310], cut[320])) == written[310:320]
        assert [len(b) for b in store.read_batches("d/big", cut[10], cut[20])] == [10]

    flip(segment_path(store_dir, "d/big", 0), events[250].offset + 20)  # outside either slice
    with pytest.raises(Corrupted, match=re.escape("checksum mismatch")):
        list(store.read("d/big", cut[10], cut[20]))
    with pytest.raises(Corrupted, match=re.escape("checksum mismatch")):
        list(store.read_batches("d/big", cut[10], cut[20]))
    assert payloads(store.read("d/big", cut[310], cut[320])) == written[310:320]


def test_a_damaged_frame_length_raises_corrupted_not_struct_error(store, store_dir):
    store.create_stream("d/frame")
    write_blocks(store, "d/frame", blocks=2)
    first = next(iter(store.read("d/frame")))
    path = segment_path(store_dir, "d/frame", 0)
    frame = first.end_offset  # the second event's frame: magic (2), key length (2), length (4)
    with path.open("r+b") as fh:
        fh.seek(frame + 4)
        fh.write((10_000).to_bytes(4, "little"))
    with pytest.raises(Corrupted) as caught:
        list(store.read("d/frame"))
    assert caught.value.offset == first.offset


def test_a_large_single_event_block_is_checked_too(store, store_dir):
    store.create_stream("d/big")
    with store.writer("d/big") as w:
        w.write(os.urandom(100_000), routing_key="k")
        w.flush()
        w.write(os.urandom(100_000), routing_key="k")
    second = list(store.read("d/big"))[1]
    flip(segment_path(store_dir, "d/big", 0), second.end_offset - 1)
    with pytest.raises(Corrupted) as caught:
        list(store.read("d/big"))
    assert caught.value.offset == second.offset


def test_bounded_reads_before_the_damage_still_work(store, store_dir):
    store.create_stream("d/bounded")
    written = write_blocks(store, "d/bounded", blocks=3)
    events = list(store.read("d/bounded"))
    flip(segment_path(store_dir, "d/bounded", 0), events[-1].offset - 3)
    end = StreamCut.of("d", "bounded", {0: events[9].end_offset})
    assert payloads(store.read("d/bounded", None, end)) == written[:10]


# --- damage is contained -------------------------------------------------------------------


def test_a_truncated_segment_refuses_writes_until_repair(store, store_dir):
    store.create_stream("d/cut", segments=2)
    keys = key_per_segment(2)
    kept = write_blocks(store, "d/cut", blocks=4, key=keys[0])
    other = write_blocks(store, "d/cut", blocks=1, key=keys[1])
    events = list(store.read_segment("d/cut", 0, 0))
    path = segment_path(store_dir, "d/cut", 0)
    os.truncate(path, events[12].offset + 7)  # inside the third block
    with pytest.raises(SegmentDamaged, match=re.escape("sluice store repair")):
        with store.writer("d/cut") as w:
            w.write(b"refused", routing_key=keys[0])
    with store.writer("d/cut") as w:  # the other segment keeps working
        w.write(b"accepted", routing_key=keys[1])
    damaged = [s.damaged for s in store.info("d/cut").segments]  # `store info` shows it
    assert damaged[1] is None
    assert damaged[0][0] == events[10].offset  # where the third block starts
    assert "before the end of its index" in damaged[0][1]
    got = []
    with pytest.raises(Corrupted):
        got.extend(e.payload for e in store.read_segment("d/cut", 0, 0))
    assert got == kept[:10]
    report = store.verify("d/cut")
    assert not report.ok and {(p.stream, p.segment) for p in report.problems} == {("d/cut", 0)}
    repaired = store.repair("d/cut")
    assert any("are lost" in p.what for p in repaired.unfixed)
    assert all(s.damaged is None for s in store.info("d/cut").segments)
    with store.writer("d/cut") as w:
        w.write(b"after repair", routing_key=keys[0])
    after = payloads(store.read("d/cut"))
    assert after[:10] == kept[:10] and set(other) | {b"accepted", b"after repair"} <= set(after)
    assert store.verify("d/cut").ok


def test_damage_in_the_unindexed_tail_is_not_cut_away_on_open(store, store_dir):
    """Blocks written but not yet indexed (the index lost rows in a power cut), the first of
    them damaged: opening the stream keeps the valid blocks after it for repair."""
    store.create_stream("d/tail")
    written = write_blocks(store, "d/tail", blocks=6)
    events = list(store.read("d/tail"))
    store.close()
    lose_index_rows(store_dir, after=events[10].offset)
    path = segment_path(store_dir, "d/tail", 0)
    size = path.stat().st_size
    flip(path, events[12].offset)
    with open_store(f"embedded:{store_dir}") as again:
        assert path.stat().st_size == size, "no valid block is cut away"
        with pytest.raises(SegmentDamaged):
            with again.writer("d/tail") as w:
                w.write(b"refused")
        report = again.repair("d/tail")
        assert report.unfixed, "the damaged block cannot be recovered"
        with again.writer("d/tail") as w:
            w.write(b"new", routing_key="k")
        got = []
        with pytest.raises(Corrupted):
            got.extend(again.read("d/tail"))
        assert payloads(got) == written[:10]
        after = StreamCut.of("d", "tail", {0: events[15].offset, 1: 0})
        assert payloads(again.read("d/tail", after))[:-1] == written[15:]


def test_damage_repair_cannot_fix_is_listed_on_every_run_with_the_cut_past_it(store, store_dir):
    """Bytes that are no block with valid blocks after them, past the index: repair indexes
    the blocks after them (a cut reaches them) and seals the segment. Every later repair, as
    verify, still lists the damage (a second one said "nothing left" while verify and reads
    failed) and names the command, with the whole cut, that reads on after it."""
    store.create_stream("d/hole")
    written = write_blocks(store, "d/hole", blocks=6)
    events = list(store.read("d/hole"))
    store.close()
    lose_index_rows(store_dir, after=events[10].offset)
    flip(segment_path(store_dir, "d/hole", 0), events[12].offset)
    damage = events[10].offset
    with open_store(f"embedded:{store_dir}") as again:
        runs = [again.repair("d/hole") for _ in range(3)]
        assert [[p.offset for p in run.unfixed] for run in runs] == [[damage]] * 3
        assert [(p.segment, p.offset) for p in again.verify("d/hole").problems] == [(0, damage)]
        with pytest.raises(Corrupted, match="the cut that reads on after it"):
            list(again.read("d/hole"))
        command = re.search(r"`sluice store read d/hole --from (\S+)`", runs[-1].unfixed[0].what)
        assert command, runs[-1].unfixed[0].what
        past = payloads(again.read("d/hole", StreamCut.parse(command[1])))
        assert past == written[15:]


def test_a_deleted_segment_file_is_reported_missing_and_no_read_makes_it_again(store_dir):
    """A read of a segment whose file was deleted stops with `Corrupted` and leaves no file
    (it used to make an empty one, so that verify then said "ends at 0", not "missing");
    verify and repair say it is missing, and repair lets the stream take writes again."""
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("d/gone")
        write_blocks(store, "d/gone", blocks=2)
        tail = store.info("d/gone").segments[0].tail
    path = segment_path(store_dir, "d/gone", 0)
    path.unlink()
    with open_store(f"embedded:{store_dir}") as store:
        with pytest.raises(Corrupted, match="the segment file is missing"):
            list(store.read("d/gone"))
        assert not path.exists()
        problems = store.verify("d/gone").problems
        assert [p.what for p in problems] == ["the segment file is missing"]
        report = store.repair("d/gone")
        lost = f"the segment file was missing: 10 events in 2 blocks from 0 to {tail} are lost"
        assert [p.what for p in report.unfixed] == [lost]
        with store.writer("d/gone") as w:
            w.write(b"again", routing_key="k")
        assert payloads(store.read("d/gone")) == [b"again"]


def lose_index_rows(store_dir: Path, after: int) -> None:
    conn = sqlite3.connect(store_dir / "catalog.db")
    conn.execute("DELETE FROM blocks WHERE offset >= ?", (after,))
    conn.commit()
    conn.close()


def key_per_segment(segments: int) -> list[str]:
    from pipeline.streams.embedded.routing import key_position

    found: dict[int, str] = {}
    for key in (f"key-{i}" for i in range(1000)):
        found.setdefault(int(key_position(key) * segments), key)
    return [found[i] for i in range(segments)]


def test_a_damaged_transaction_body_is_never_landed(store, store_dir):
    store.create_stream("d/txn")
    txn = store.begin_transaction("d/txn")
    txn.write(b"a" * 100, routing_key="k")
    txn.flush()
    body = next((store_dir / "txn").glob("*.body"))
    flip(body, 50)
    assert any(txn.txn_id in p.what for p in store.verify("d/txn").problems)
    with pytest.raises(TxnFailed, match="damaged"):
        txn.commit()
    assert list(store.read("d/txn")) == []
    assert store.verify("d/txn").problems, "still reported until the transaction is aborted"


# --- a lost catalog ------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["deleted", "emptied", "random bytes"])
def test_a_lost_catalog_is_refused_then_rebuilt(store_dir, loss):
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("c/a", segments=2)
        store.create_stream("c/b")
        a = write_blocks(store, "c/a", blocks=3)
        b = write_blocks(store, "c/b", blocks=2)
        txn = store.begin_transaction("c/b")
        txn.write(b"in a transaction", routing_key="k")
        txn.commit(time_bounds=(1, 2))
    for path in store_dir.glob("catalog.db*"):
        path.unlink()
    if loss == "emptied":
        (store_dir / "catalog.db").write_bytes(b"")
    elif loss == "random bytes":
        (store_dir / "catalog.db").write_bytes(os.urandom(16384))
    expected = CatalogDamaged if loss == "random bytes" else CatalogMismatch
    with open_store(f"embedded:{store_dir}") as store:
        with pytest.raises(expected, match=re.escape("sluice store repair")):
            store.list_streams()
        with pytest.raises(expected):
            store.create_stream("c/new")
        assert not store.verify().ok
        report = store.repair()
        assert report.ok, report.unfixed
    with open_store(f"embedded:{store_dir}") as store:
        assert store.list_streams() == ["c/a", "c/b"]
        assert payloads(store.read("c/a")) == a
        assert payloads(store.read("c/b")) == [*b, b"in a transaction"]
        assert store.get_transaction("c/b", txn.txn_id).state() == "committed"
        assert store.create_stream("c/new")
        assert list(store.read("c/new")) == [], "a new stream never meets old files"
        assert store.verify().ok


def test_a_stream_created_over_a_lost_catalog_never_reads_old_events(store_dir):
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("old/s")
        write_blocks(store, "old/s", blocks=2)
    (store_dir / "catalog.db").unlink()
    with open_store(f"embedded:{store_dir}") as store:
        with pytest.raises(CatalogMismatch):
            store.create_stream("other/s")
    assert (store_dir / "data" / "1" / "0.seg").exists()


def copy_catalog(store_dir: Path, saved: Path) -> Path:
    """A copy of the store's catalog (with its WAL), as a backup would keep it."""
    saved.mkdir()
    for path in store_dir.glob("catalog.db*"):
        shutil.copy(path, saved / path.name)
    return saved


def restore_catalog(store_dir: Path, saved: Path) -> None:
    """The catalog copied back over the store's, as restoring a backup does."""
    for path in store_dir.glob("catalog.db*"):
        path.unlink()
    for path in saved.iterdir():
        shutil.copy(path, store_dir / path.name)


def test_an_older_catalog_copy_is_refused(store_dir, tmp_path):
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("c/first")
    saved = copy_catalog(store_dir, tmp_path / "saved")
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("c/second")
        write_blocks(store, "c/second", blocks=1)
    restore_catalog(store_dir, saved)
    with open_store(f"embedded:{store_dir}") as store:
        with pytest.raises(CatalogMismatch, match="c/second"):
            store.list_streams()


def test_a_catalog_restored_from_before_a_scale_is_refused_and_repair_finds_the_events_after(
    store_dir, tmp_path
):
    """A catalog copied back from before a scale knows nothing of the new segments: taken as
    it was, it hid every event written to them (and sent writes to the sealed segment again).
    It is refused, and `repair` rebuilds the catalog from the data files with them."""
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("c/scaled")
        before = write_blocks(store, "c/scaled", blocks=2)
    saved = copy_catalog(store_dir, tmp_path / "saved")
    with open_store(f"embedded:{store_dir}") as store:
        store.split_segment("c/scaled", 0, 2)
        after = write_blocks(store, "c/scaled", blocks=2, key="k")
    restore_catalog(store_dir, saved)
    with open_store(f"embedded:{store_dir}") as store:
        with pytest.raises(CatalogMismatch, match="segments the catalog does not know"):
            list(store.read("c/scaled"))
        assert store.repair().ok
        assert payloads(store.read("c/scaled")) == before + after
        assert [s.sealed for s in store.info("c/scaled").segments] == [True, False, False]


def test_another_stores_catalog_is_refused(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for root in (one, two):
        with open_store(f"embedded:{root}") as store:
            store.create_stream("c/s")
    for path in one.glob("catalog.db*"):
        shutil.copy(path, two / path.name)
    with open_store(f"embedded:{two}") as store:
        with pytest.raises(CatalogMismatch, match="belongs to store"):
            store.list_streams()


def test_a_deleted_streams_id_is_never_used_again(store, store_dir):
    store.create_stream("c/gone")
    write_blocks(store, "c/gone", blocks=1)
    store.seal_stream("c/gone")
    store.delete_stream("c/gone")
    store.create_stream("c/next")
    assert segment_path(store_dir, "c/next", 0).parent.name == "2"


# --- strict inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("number", [0, -1, MAX_EVENT_NUMBER + 1, 2**64, True, 1.5, "7"])
def test_event_numbers_outside_the_range_are_refused(store, number):
    store.create_stream("in/n")
    with store.writer("in/n", writer_id="w") as w:
        w.write(b"kept", routing_key="k", event_number=1)
        with pytest.raises(InvalidEventNumber, match="out of range"):
            w.write(b"refused", routing_key="k", event_number=number)
    assert payloads(store.read("in/n")) == [b"kept"]
    with store.writer("in/n", writer_id="w") as w:
        w.write(b"last", routing_key="k", event_number=MAX_EVENT_NUMBER)
    assert store.writer("in/n", writer_id="w").last_event_number() == MAX_EVENT_NUMBER
    assert store.verify("in/n").ok


@pytest.mark.parametrize(
    "text",
    [
        "v1~a~b~0-\u00b2",
        "v1~a~b~\u0663-0",
        "v1~a~b~0-\uff11",
        "v1~a~b~0-1e3",
        "v1~a~b~0-+1",
        "v1~a~b~0-99999999999999999999",
    ],
)
def test_cut_text_takes_ascii_digits_only(text):
    with pytest.raises(InvalidCut):
        StreamCut.parse(text)


def test_a_cut_must_name_every_segment(store):
    store.create_stream("in/cut", segments=3)
    write_blocks(store, "in/cut", blocks=1)
    tail = store.tail("in/cut").segments
    partial = StreamCut.of("in", "cut", {0: tail[0], 2: tail[2]})
    with pytest.raises(InvalidCut, match=re.escape("does not name segment 1")):
        list(store.read("in/cut", partial))
    with pytest.raises(InvalidCut, match=re.escape("does not name segment 1")):
        store.truncate(partial)
    with pytest.raises(InvalidCut, match=re.escape("does not name segment 1")):
        store.reader_group("partial", "in/cut", partial)
    assert len(list(store.read("in/cut"))) == 5


def test_a_cut_from_before_a_scale_still_reads(store):
    store.create_stream("in/scale")
    write_blocks(store, "in/scale", blocks=1)
    before = store.tail("in/scale")
    store.split_segment("in/scale", 0)
    write_blocks(store, "in/scale", blocks=1)
    assert len(list(store.read("in/scale", before))) == 5
    only_one_successor = StreamCut.of("in", "scale", {**before.segments, 1: 0})
    with pytest.raises(InvalidCut, match=re.escape("does not name segment 2")):
        list(store.read("in/scale", only_one_successor))


def test_a_cut_past_the_tail_names_the_tail(store):
    store.create_stream("in/past")
    write_blocks(store, "in/past", blocks=1)
    tail = store.tail("in/past")
    past = StreamCut.of("in", "past", {0: tail.segments[0] + 100})
    with pytest.raises(InvalidCut, match=re.escape(f"the stream's tail is {tail.text}")):
        list(store.read("in/past", None, past))
    with pytest.raises(InvalidCut, match="negative"):
        list(store.read("in/past", StreamCut.of("in", "past", {0: -1})))
    assert len(list(store.read("in/past"))) == 5


# --- verify and repair ---------------------------------------------------------------------


def test_verify_and_repair_of_an_intact_store_report_nothing_and_show_progress(store):
    store.create_stream("v/s", segments=2)
    write_blocks(store, "v/s", blocks=5)
    seen: list[tuple[int, int]] = []
    report = store.verify(progress=lambda done, total: seen.append((done, total)))
    assert report.ok and report.streams == 1 and report.segments == 2 and report.blocks == 5
    assert seen and seen[-1][0] == seen[-1][1] == report.bytes
    assert [d for d, _ in seen] == sorted(d for d, _ in seen), "progress only moves forward"
    repaired = store.repair()
    assert repaired.ok and repaired.fixed == ()
    assert str(Problem("v/s", 1, 40, "what")) == "v/s segment 1 offset 40: what"


def make_version_1(store_dir: Path) -> None:
    """Turn a closed store into what a version-1 store looks like: no store.json, no
    manifests, no store id, format 1 in the catalog."""
    (store_dir / "store.json").unlink()
    for manifest in (store_dir / "data").glob("*/stream.json"):
        manifest.unlink()
    conn = sqlite3.connect(store_dir / "catalog.db")
    conn.execute("DELETE FROM meta WHERE key='store_id'")
    conn.execute("UPDATE meta SET value='1' WHERE key='format_version'")
    conn.commit()
    conn.close()


def test_a_version_1_store_is_adopted_and_can_then_lose_its_catalog(store_dir):
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("v1/s", segments=2)
        written = write_blocks(store, "v1/s", blocks=3)
    make_version_1(store_dir)
    with open_store(f"embedded:{store_dir}") as store:
        assert payloads(store.read("v1/s")) == written
        assert store.verify().ok
    assert (store_dir / "store.json").exists()
    segment_path(store_dir, "v1/s", 0)  # found through its manifest: every stream got one
    for path in store_dir.glob("catalog.db*"):
        path.unlink()
    with open_store(f"embedded:{store_dir}") as store:
        assert store.repair().ok
        assert payloads(store.read("v1/s")) == written


def test_a_commit_refused_by_damage_keeps_its_events_once(store):
    """Events written but not flushed when a commit is refused (a damaged segment) are
    recorded once: the commit after `repair` lands each of them exactly once."""
    store.create_stream("d/refused")
    txn = store.begin_transaction("d/refused")
    txn.write(b"flushed", routing_key="k")
    txn.flush()
    txn.write(b"pending", routing_key="k")
    engine = store._engine
    engine.mark_damaged(engine.stream_row("d/refused"), 0, 0, "marked by the test")
    with pytest.raises(SegmentDamaged):
        txn.commit()
    assert txn.state() == "open"
    assert list(store.read("d/refused")) == []
    store.repair("d/refused")
    txn.commit()
    assert sorted(e.payload for e in store.read("d/refused")) == [b"flushed", b"pending"]
