"""The stream-store contract (docs/architecture.md, semantics 1-7), run against every backend.

The embedded store always runs; a Pravega cluster runs when SLUICE_TEST_PRAVEGA=tcp://host:9090
is set (the suite never starts a Pravega server itself).
"""

from __future__ import annotations

import re
import uuid

import pytest

from pipeline.streams import (
    MAX_EVENT_SIZE,
    CutStreamMismatch,
    EventTooLarge,
    InvalidArgument,
    InvalidCut,
    InvalidName,
    StreamCut,
    StreamNotFound,
    StreamSealed,
    Truncated,
    TxnFailed,
    TxnNotFound,
    open_store,
)
from tests.pravega import pravega_backend, pravega_uri

BACKENDS = ["embedded", pravega_backend("the contract")]


@pytest.fixture(params=BACKENDS)
def backend(request, tmp_path):
    if request.param == "embedded":
        store = open_store(f"embedded:{tmp_path / 'streams'}")
    else:
        store = open_store(pravega_uri())
    with store:
        yield store


@pytest.fixture
def stream(backend):
    name = f"contract/s{uuid.uuid4().hex[:10]}"
    backend.create_stream(name, segments=3 if "multi_segment" in backend.features else 1)
    return name


def requires(backend, feature: str) -> None:
    """Skip, naming the gap, when a backend documents that it cannot do `feature`."""
    if feature not in backend.features:
        pytest.skip(f"{type(backend).__name__} cannot: {feature} (see its docstring)")


def payloads(events):
    return [e.payload for e in events]


def test_create_list_info(backend, stream):
    assert backend.create_stream(stream) is False
    assert stream in backend.list_streams("contract")
    assert "contract" in backend.list_scopes()
    info = backend.info(stream)
    assert len(info.segments) == (3 if "multi_segment" in backend.features else 1)
    assert info.events == 0
    assert info.head == info.tail


def test_per_key_order_across_segments(backend, stream):
    requires(backend, "multi_segment")
    with backend.writer(stream) as w:
        for i in range(300):
            w.write(f"{i % 7}:{i}".encode(), routing_key=f"sensor-{i % 7}")
    events = list(backend.read(stream))
    assert len(events) == 300
    by_key: dict[str, list[int]] = {}
    for e in events:
        key, seq = e.payload.decode().split(":")
        assert e.routing_key == f"sensor-{key}"
        by_key.setdefault(key, []).append(int(seq))
    assert all(seqs == sorted(seqs) for seqs in by_key.values())
    assert len({e.segment for e in events}) > 1, "seven keys should spread over segments"
    segments_of_key = {}
    for e in events:
        segments_of_key.setdefault(e.routing_key, set()).add(e.segment)
    assert all(len(s) == 1 for s in segments_of_key.values()), "a key lives in one segment"


def test_read_between_cuts_is_exact_and_repeatable(backend, stream):
    with backend.writer(stream) as w:
        for i in range(50):
            w.write(f"a{i}".encode(), routing_key=f"k{i % 5}")
    middle = backend.tail(stream)
    with backend.writer(stream) as w:
        for i in range(40):
            w.write(f"b{i}".encode(), routing_key=f"k{i % 5}")
    end = backend.tail(stream)
    with backend.writer(stream) as w:
        w.write(b"after", routing_key="k1")
    first = payloads(backend.read(stream, middle, end))
    assert sorted(first) == sorted(f"b{i}".encode() for i in range(40))
    assert payloads(backend.read(stream, middle, end)) == first
    assert len(list(backend.read(stream, None, middle))) == 50


def test_event_offsets_are_cut_positions(backend, stream):
    with backend.writer(stream) as w:
        for i in range(20):
            w.write(f"e{i}".encode(), routing_key="one-key")
    events = list(backend.read(stream))
    tenth = events[10]
    start = StreamCut.of(
        *stream.split("/"), {**backend.head(stream).segments, tenth.segment: tenth.offset}
    )
    got = [e for e in backend.read(stream, start) if e.segment == tenth.segment]
    assert payloads(got) == [f"e{i}".encode() for i in range(10, 20)]
    end = StreamCut.of(*stream.split("/"), {**start.segments, tenth.segment: events[12].end_offset})
    assert payloads(backend.read(stream, start, end)) == [b"e10", b"e11", b"e12"]


def test_cut_text_round_trip(backend, stream):
    with backend.writer(stream) as w:
        w.write(b"x", routing_key="k")
    tail = backend.tail(stream)
    assert StreamCut.parse(tail.text) == tail
    assert re.fullmatch(r"[A-Za-z0-9._~\-]+", tail.text), "cut text must be URL-safe"


def test_writer_resend_is_a_noop(backend, stream):
    requires(backend, "writer_ids")
    w = backend.writer(stream, writer_id="edge-1")
    for n in range(1, 11):
        w.write(f"e{n}".encode(), routing_key="k", event_number=n)
    w.flush()
    again = backend.writer(stream, writer_id="edge-1")
    assert again.last_event_number() == 10
    for n in range(5, 13):  # 5..10 resent after a lost acknowledgement, 11 and 12 new
        again.write(f"e{n}".encode(), routing_key="k", event_number=n)
    again.flush()
    assert payloads(backend.read(stream)) == [f"e{n}".encode() for n in range(1, 13)]


def test_transaction_atomic_contiguous_and_idempotent(backend, stream):
    requires(backend, "txn_flush")
    txn = backend.begin_transaction(stream)
    for i in range(30):
        txn.write(f"t{i}".encode(), routing_key=f"k{i % 3}")
    with backend.writer(stream) as w:
        w.write(b"outside", routing_key="k0")
    txn.flush()
    assert b"t0" not in payloads(backend.read(stream)), "uncommitted events are invisible"
    again = backend.get_transaction(stream, txn.txn_id)
    again.commit()
    again.commit()  # committing twice is not an error
    assert txn.state() == "committed"
    events = list(backend.read(stream))
    for segment in {e.segment for e in events}:
        seq = [e.payload for e in events if e.segment == segment]
        txn_positions = [i for i, p in enumerate(seq) if p.startswith(b"t")]
        if txn_positions:
            assert txn_positions == list(range(txn_positions[0], txn_positions[-1] + 1))
    assert sorted(p for p in payloads(events) if p.startswith(b"t")) == sorted(
        f"t{i}".encode() for i in range(30)
    )


def test_aborted_transaction_cannot_commit(backend, stream):
    txn = backend.begin_transaction(stream)
    txn.write(b"gone")
    txn.abort()
    with pytest.raises(TxnFailed, match="aborted"):
        txn.commit()
    assert list(backend.read(stream)) == []


@pytest.mark.parametrize("lease", [0, -1, float("nan"), float("inf"), 1e300, 11 * 365 * 86_400])
def test_a_lease_no_transaction_can_have_is_refused_when_it_begins(backend, stream, lease):
    rule = "a transaction's lease is more than 0 and at most 315,360,000 s"
    said = f"invalid lease_seconds {lease!r}: {rule}"
    with pytest.raises(InvalidArgument, match=re.escape(said)):
        backend.begin_transaction(stream, lease)
    txn = backend.begin_transaction(stream, 10 * 365 * 86_400)  # the longest there is
    txn.write(b"kept")
    txn.commit()
    assert payloads(backend.read(stream)) == [b"kept"]


def test_unknown_transaction(backend, stream):
    with pytest.raises(TxnNotFound):
        backend.get_transaction(stream, uuid.uuid4().hex).commit()


def test_time_cuts_bound_a_window(backend, stream):
    requires(backend, "time_cuts")
    for hour in range(4):
        txn = backend.begin_transaction(stream)
        txn.write(f"h{hour}".encode(), routing_key="sensor")
        base = hour * 3600 * 10**9
        txn.commit(time_bounds=(base, base + 3599 * 10**9))
    start, end = backend.time_cuts(stream, 3600 * 10**9, 3 * 3600 * 10**9)
    assert payloads(backend.read(stream, start, end)) == [b"h1", b"h2"]


def test_reader_group_shares_segments_and_persists(backend, stream):
    requires(backend, "reader_groups")
    with backend.writer(stream) as w:
        for i in range(90):
            w.write(f"{i}".encode(), routing_key=f"k{i % 9}")
    group = backend.reader_group("rg-contract", stream)
    r1, r2 = group.reader("r1"), group.reader("r2")
    got1 = r1.read(1000)
    got2 = r2.read(1000)
    got1 += r1.read(1000)  # r1 may hold more segments than its share until r2 joined
    seen = sorted(int(e.payload) for e in got1 + got2)
    assert seen == list(range(90))
    r1.commit()
    r2.commit()
    cut = group.checkpoint("first")
    assert cut == backend.tail(stream)
    r1.close()
    r2.close()
    with backend.writer(stream) as w:
        w.write(b"90", routing_key="k0")
    reopened = backend.reader_group("rg-contract", stream).reader("r3")
    assert [e.payload for e in reopened.read(1000)] == [b"90"]
    reopened.close()


def test_truncation(backend, stream):
    with backend.writer(stream) as w:
        for i in range(10):
            w.write(f"old{i}".encode(), routing_key="k")
    cut = backend.tail(stream)
    with backend.writer(stream) as w:
        w.write(b"new", routing_key="k")
    head = backend.head(stream)
    backend.truncate(cut)
    assert payloads(backend.read(stream)) == [b"new"]
    with pytest.raises(Truncated, match="truncated"):
        list(backend.read(stream, head))
    assert list(backend.read(stream, head, head)) == [], "an empty range reads nothing"


def test_seal_refuses_writes(backend, stream):
    backend.seal_stream(stream)
    w = backend.writer(stream)
    with pytest.raises(StreamSealed):  # refused at write or at the latest at flush
        w.write(b"late")
        w.flush()
    backend.delete_stream(stream)
    with pytest.raises(StreamNotFound):
        backend.info(stream)


# --- limits and bad input (semantic 7): typed errors, nothing stored is harmed -------------


def test_event_too_large(backend, stream):
    with backend.writer(stream) as w:
        w.write(b"kept", routing_key="k")
        w.write(b"x" * MAX_EVENT_SIZE, routing_key="k")  # exactly the limit is fine
        with pytest.raises(EventTooLarge, match=re.escape(f"over the limit of {MAX_EVENT_SIZE:,}")):
            w.write(b"x" * (MAX_EVENT_SIZE + 1), routing_key="k")
    assert [len(p) for p in payloads(backend.read(stream))] == [4, MAX_EVENT_SIZE]


@pytest.mark.parametrize(
    "name", ["../x/y", "a/b/c", "", "/x", "x/", "s/" + "n" * 300, "s/ünïcode", "s/.hidden", "s/a b"]
)
def test_bad_names(backend, name):
    with pytest.raises(InvalidName):
        backend.create_stream(name)
    assert backend.list_streams() == []


def test_unknown_stream(backend):
    with pytest.raises(StreamNotFound, match=re.escape("stream contract/nope does not exist")):
        backend.tail("contract/nope")


def test_cut_from_another_stream(backend, stream):
    other = stream + "-other"
    backend.create_stream(other)
    with pytest.raises(CutStreamMismatch):
        list(backend.read(stream, backend.tail(other)))


@pytest.mark.parametrize(
    "text", ["", "v1", "v2~a~b~0-0", "v1~a~b~0", "v1~a~b~x-1", "v1~a~b~0-1~0-2", "v1~../~b~0-0"]
)
def test_malformed_cut_text(text):
    with pytest.raises(InvalidCut):
        StreamCut.parse(text)


def test_cut_not_on_event_boundary(backend, stream):
    with backend.writer(stream) as w:
        w.write(b"0123456789" * 10, routing_key="k")
    tail = backend.tail(stream)
    seg, off = next((s, o) for s, o in tail.positions if o > 0)
    bad = StreamCut.of(*stream.split("/"), {**backend.head(stream).segments, seg: off - 3})
    with pytest.raises(InvalidCut, match="not an event boundary"):
        list(backend.read(stream, bad))
    assert len(list(backend.read(stream))) == 1
