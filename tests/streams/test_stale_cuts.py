"""A cut of a stream deleted and created again under its name is refused (`StaleCut`).

The embedded store's cuts carry the stream's id (text `v2`), which is never reused; `v1` texts
(stored before, or built from offsets) are still read, unchecked. The Spark source's driver
side is exercised here too (no Spark session is needed for it)."""

from __future__ import annotations

import pickle
import re

import pytest

from pipeline.spark.options import SourceOptions
from pipeline.spark.reading import SluiceBatchReader, SluiceStreamReader, admit, offset_of
from pipeline.streams import InvalidCut, StreamCut, open_store
from pipeline.streams.errors import StaleCut

STREAM = "site/net"


def write(store, *payloads: bytes) -> None:
    with store.writer(STREAM) as writer:
        for payload in payloads:
            writer.write(payload, "k")


@pytest.fixture
def recreated(store):
    """The store, the tail and a mid-stream cut of a first `site/net`, which was then deleted
    and created again with six new events (more than the first had)."""
    store.create_stream(STREAM)
    write(store, b"old-0", b"old-1", b"old-2")
    second = [e for e in store.read(STREAM)][1]
    old_tail = store.tail(STREAM)
    old_mid = old_tail.moved_to({0: second.offset})
    store.seal_stream(STREAM)
    store.delete_stream(STREAM)
    store.create_stream(STREAM)
    write(store, *(f"new-{i}".encode() for i in range(6)))
    return store, old_tail, old_mid


def stale_message(cut: StreamCut) -> str:
    return re.escape(
        f"invalid stream cut {cut.text!r}: it is a cut of an earlier stream named {STREAM}"
        f" (stream id {cut.stream_id}"
    )


def test_cuts_name_the_stream_and_round_trip(store):
    store.create_stream(STREAM)
    write(store, b"a")
    tail = store.tail(STREAM)
    assert tail.stream_id is not None
    assert tail.text == f"v2~site~net~{tail.stream_id}~0-{tail.offset(0)}"
    assert StreamCut.parse(tail.text) == tail
    assert store.head(STREAM).stream_id == tail.stream_id == store.info(STREAM).tail.stream_id
    assert StreamCut.of("site", "net", {0: 5}).text == "v1~site~net~0-5"
    assert StreamCut.parse("v1~site~net~0-5").stream_id is None


@pytest.mark.parametrize(
    "text", ["v2~a~b", "v2~a~b~x~0-0", "v2~a~b~0-0", "v2~a~b~-1~0-0", "v2~a~b~99999999999999999999"]
)
def test_malformed_v2_texts_are_invalid(text):
    with pytest.raises(InvalidCut):
        StreamCut.parse(text)


def test_reads_from_a_cut_of_the_deleted_stream_are_refused(recreated):
    store, old_tail, old_mid = recreated
    for cut in (old_tail, old_mid, old_tail.text):
        parsed = StreamCut.parse(cut) if isinstance(cut, str) else cut
        with pytest.raises(StaleCut, match=stale_message(parsed) + ".*deleted since"):
            list(store.read(STREAM, start=cut))
    with pytest.raises(StaleCut):
        list(store.read(STREAM, end=old_tail))
    with pytest.raises(StaleCut):
        list(store.read_batches(STREAM, start=old_mid, end=old_tail))
    with pytest.raises(StaleCut):
        store.truncate(old_mid)
    assert [e.payload for e in store.read(STREAM)] == [f"new-{i}".encode() for i in range(6)]


def test_reader_groups_refuse_a_cut_of_the_deleted_stream(recreated):
    store, old_tail, _ = recreated
    with pytest.raises(StaleCut, match=stale_message(old_tail)):
        store.reader_group("g", STREAM, start=old_tail)
    group = store.reader_group("g", STREAM)
    with pytest.raises(StaleCut, match=stale_message(old_tail)):
        group.reset(old_tail)
    with group.reader("r") as reader:
        assert len(reader.read(timeout=0.5)) == 6  # still at the head


def test_head_tail_and_cuts_of_the_new_stream_work(recreated):
    store, old_tail, _ = recreated
    head, tail = store.head(STREAM), store.tail(STREAM)
    assert tail.stream_id != old_tail.stream_id
    middle = [e for e in store.read(STREAM)][3]
    from_offsets = StreamCut.of("site", "net", {0: middle.offset})  # v1, built by a user
    assert [e.payload for e in store.read(STREAM, start=from_offsets, end=tail)] == [
        b"new-3",
        b"new-4",
        b"new-5",
    ]
    assert len(list(store.read(STREAM, start=head.text, end=tail.text))) == 6


def test_a_v1_cut_of_the_deleted_stream_cannot_be_checked(recreated):
    """What FORMAT.md says: a v1 text carries no identity, so it is used as it always was."""
    store, old_tail, _ = recreated
    legacy = StreamCut.of(old_tail.scope, old_tail.stream_name, old_tail.segments)
    assert legacy.text.startswith("v1~")
    assert len(list(store.read(STREAM, start=legacy))) == 3


def test_stale_cut_survives_pickling(recreated):
    store, old_tail, _ = recreated
    with pytest.raises(StaleCut) as caught:
        list(store.read(STREAM, start=old_tail))
    copy = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(copy, StaleCut) and str(copy) == str(caught.value)
    assert (copy.cut_stream_id, copy.stream_id) == (
        old_tail.stream_id,
        store.tail(STREAM).stream_id,
    )


def test_a_cut_of_another_store_is_named_so(recreated, tmp_path):
    store, _, _ = recreated
    with open_store(f"embedded:{tmp_path / 'other'}") as other:
        for name in ("a/b", "c/d", "e/f", STREAM):
            other.create_stream(name)
        foreign = other.tail(STREAM)
    with pytest.raises(StaleCut, match="which this store never had: a cut from another store"):
        list(store.read(STREAM, start=foreign))


def options(store, **more: str) -> SourceOptions:
    return SourceOptions.parse({"store": store.uri, "stream": STREAM, **more})


def test_the_spark_source_refuses_cuts_of_the_deleted_stream(recreated):
    store, old_tail, old_mid = recreated
    with pytest.raises(StaleCut, match=stale_message(old_mid)):
        SluiceBatchReader(options(store, startingCut=old_mid.text))
    with pytest.raises(StaleCut, match=stale_message(old_tail)):
        SluiceBatchReader(options(store, endingCut=old_tail.text))
    reader = SluiceStreamReader(options(store, startingCut=old_mid.text))
    try:
        with pytest.raises(StaleCut):
            reader.initialOffset()
        # an offset that a checkpoint of the old stream holds: the next batch and a batch
        # planned before a restart are both refused
        with pytest.raises(StaleCut, match=stale_message(old_mid)):
            reader.latestOffset(offset_of(old_mid), reader.getDefaultReadLimit())
        with pytest.raises(StaleCut):
            reader.partitions(offset_of(old_mid), offset_of(old_tail))
    finally:
        reader.stop()


def test_the_spark_source_keeps_the_identity_in_its_offsets(recreated):
    store, _, _ = recreated
    head, tail = store.head(STREAM), store.tail(STREAM)
    admitted = admit(store, STREAM, begin=head, ceiling=tail, max_events=2, max_bytes=None)
    assert admitted.stream_id == tail.stream_id
    reader = SluiceStreamReader(options(store, startingCut="head"))
    try:
        start = reader.initialOffset()
        latest = reader.latestOffset(start, reader.getDefaultReadLimit())
        assert StreamCut.parse(latest["cut"]) == tail
        legacy = StreamCut.of("site", "net", head.segments)  # an offset stored before v2
        latest = reader.latestOffset(offset_of(legacy), reader.getDefaultReadLimit())
        assert StreamCut.parse(latest["cut"]) == tail  # upgraded to v2 from then on
        assert len(reader.partitions(offset_of(legacy), latest)) >= 1
    finally:
        reader.stop()
