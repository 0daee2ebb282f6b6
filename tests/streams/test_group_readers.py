"""Reader groups as a library user drives them: readers that restart, die, stall or outlive
their group; a scale racing a rebalance; positions reset under readers; bad arguments."""

from __future__ import annotations

import threading

import pytest

from pipeline.streams import (
    CutStreamMismatch,
    InvalidArgument,
    InvalidName,
    ReaderGroupNotFound,
    Truncated,
    open_store,
)
from pipeline.streams.embedded import readers
from pipeline.streams.errors import ReaderGroupConflict, ReaderOffline


def write(store, stream, seqs, key="k"):
    with store.writer(stream) as w:
        for i in seqs:
            w.write(f"{key}:{i}".encode(), routing_key=key)


def seqs(events):
    return [int(e.payload.split(b":")[1]) for e in events]


@pytest.fixture
def ten(store):
    """A one-segment stream of ten events and a group over it."""
    store.create_stream("rg/ten")
    write(store, "rg/ten", range(10))
    return store.reader_group("g", "rg/ten")


def test_a_reader_restarted_with_its_id_reads_what_it_had_not_committed(ten):
    killed = ten.reader("r1")
    assert seqs(killed.read(3)) == [0, 1, 2]
    killed.commit()
    assert seqs(killed.read(3)) == [3, 4, 5]  # then its process dies: no commit, no close
    restarted = ten.reader("r1")
    assert seqs(restarted.read(100)) == list(range(3, 10))
    with pytest.raises(ReaderOffline, match="a new reader with its id"):
        killed.read()


def test_reader_offline_hands_a_dead_readers_segments_to_the_others(ten):
    dead, alive = ten.reader("dead"), ten.reader("alive")
    assert seqs(dead.read(4)) == [0, 1, 2, 3]
    dead.commit()
    assert seqs(dead.read(2)) == [4, 5]  # never committed
    assert alive.read(100, timeout=0.1) == []  # the segment is still the dead reader's
    ten.reader_offline("dead")
    assert seqs(alive.read(100)) == list(range(4, 10))
    with pytest.raises(ReaderOffline, match="reader_offline"):
        dead.commit()


def test_a_reader_presumed_dead_stops_reading_what_another_took_over(ten, monkeypatch):
    monkeypatch.setattr(readers, "READER_TIMEOUT_S", 0.0)
    stalled = ten.reader("stalled")
    assert seqs(stalled.read(3)) == [0, 1, 2]
    other = ten.reader("other")
    assert seqs(other.read(100)) == list(range(10))  # from the committed position
    other.commit()
    with pytest.raises(ReaderOffline, match="segment\\(s\\) 0 to other readers"):
        stalled.commit()  # it must not commit over the new owner's position
    assert stalled.read(100) == [], "two readers read one segment"
    assert ten.stream_cut().segments == {0: ten.engine.tail(ten.row).segments[0]}


def test_a_reset_moves_readers_that_are_reading(ten):
    reader = ten.reader("r")
    assert seqs(reader.read(100)) == list(range(10))
    reader.commit()
    ten.reset(ten.engine.head(ten.row))
    assert seqs(reader.read(100)) == list(range(10))


def test_deleting_a_group_stops_its_readers_and_its_name_can_be_used_again(store, ten):
    reader = ten.reader("r")
    assert seqs(reader.read(4)) == [0, 1, 2, 3]
    reader.commit()
    store.delete_reader_group("g")
    with pytest.raises(ReaderGroupNotFound):
        reader.read()
    with pytest.raises(ReaderGroupNotFound):
        ten.reset(store.head("rg/ten"))
    again = store.reader_group("g", "rg/ten", store.tail("rg/ten"))
    write(store, "rg/ten", [10])
    assert seqs(again.reader("r").read(100)) == [10]


def test_a_group_never_continues_into_a_new_stream_of_the_same_name(store, ten):
    with ten.reader("r") as reader:
        assert len(reader.read(100)) == 10
    store.seal_stream("rg/ten")
    store.delete_stream("rg/ten")
    store.create_stream("rg/ten")
    write(store, "rg/ten", range(100, 120))
    with pytest.raises(ReaderGroupConflict, match="rg/ten that was deleted"):
        store.reader_group("g", "rg/ten")
    store.create_stream("rg/other")
    store.delete_reader_group("g")
    store.reader_group("g", "rg/ten")
    with pytest.raises(ReaderGroupConflict, match="it reads rg/ten"):
        store.reader_group("g", "rg/other")


def test_a_scale_right_before_a_rebalance_does_not_let_successors_jump_ahead(store_dir):
    """Reader `b` rebalances just after a split of the segment `a` is still reading: the
    successors wait until `a` has read (and committed) their predecessor to its end."""
    with open_store(f"embedded:{store_dir}") as store, open_store(f"embedded:{store_dir}") as b_s:
        store.create_stream("rg/split")
        write(store, "rg/split", range(10))
        a = store.reader_group("g", "rg/split").reader("a")
        b = b_s.reader_group("g", "rg/split").reader("b")
        assert seqs(a.read(1)) == [0]
        catalog = b_s._engine.catalog
        write_lock = catalog.write

        def scale_first(*args, **kwargs):  # the split lands as `b` asks for the catalog
            catalog.write = write_lock
            store.split_segment("rg/split", 0)
            write(store, "rg/split", range(10, 20))
            return write_lock(*args, **kwargs)

        catalog.write = scale_first
        assert b.read(100) == [], "a successor was read before its predecessor's end"
        assert seqs(a.read(100)) == list(range(1, 10))
        a.commit()
        assert seqs(a.read(100) + b.read(100)) == list(range(10, 20))


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("max_events", "timeout"),
    [(0, 0.0), (-1, 0.0), (True, 0.0), (1.5, 0.0), (10, float("nan")), (10, -1.0), (10, "1")],
)
def test_bad_read_arguments_are_refused(ten, max_events, timeout):
    reader = ten.reader("r")
    with pytest.raises(InvalidArgument):
        reader.read(max_events, timeout)
    assert seqs(reader.read(1)) == [0]


def test_a_read_waits_for_an_event_up_to_its_timeout(store, ten):
    reader = ten.reader("r")
    assert len(reader.read(100)) == 10
    threading.Timer(0.2, write, (store, "rg/ten", [10])).start()
    assert seqs(reader.read(100, timeout=float("inf"))) == [10]


@pytest.mark.parametrize("name", ["", "x" * 256, "bad\udcff", "a/b", "../up", None])
def test_bad_reader_and_checkpoint_names_are_refused(ten, name):
    with pytest.raises(InvalidName):
        ten.reader(name)
    with pytest.raises(InvalidName):
        ten.reader_offline(name)
    with pytest.raises(InvalidName):
        ten.checkpoint(name)


def test_cuts_of_another_stream_or_past_the_head_are_refused(store, ten):
    store.create_stream("rg/other")
    write(store, "rg/other", range(3))
    with pytest.raises(CutStreamMismatch):
        store.reader_group("g2", "rg/ten", store.tail("rg/other"))
    with pytest.raises(CutStreamMismatch):
        ten.reset(store.tail("rg/other"))
    saved = ten.checkpoint("before")
    store.truncate(store.tail("rg/ten"))
    ten.reset(saved)
    with pytest.raises(Truncated, match=r"truncated at offset \d+: position 0") as caught:
        ten.reader("r").read()
    assert caught.value.truncated_at == store.head("rg/ten").segments[0]
