"""Truncation behind a scale: a position taken before a scale that a truncation has since
passed in the successors raises `Truncated`, never reads on from the successors' heads."""

from __future__ import annotations

import re

import pytest

from pipeline.streams import Truncated


def write(store, stream, seqs):
    with store.writer(stream) as w:
        for i in seqs:
            w.write(f"k:{i}".encode(), routing_key="k")


@pytest.fixture
def scaled(store):
    """`sc/s`: events 0-9 in segment 0, then a split into 1 and 2, events 10-19, a cut,
    events 20-29, and a truncation at that cut. Returns the tail cut taken before the split."""
    store.create_stream("sc/s")
    write(store, "sc/s", range(10))
    before = store.tail("sc/s")
    store.split_segment("sc/s", 0, 2)
    write(store, "sc/s", range(10, 20))
    store.truncate(store.tail("sc/s"))  # events 10-19 are gone
    write(store, "sc/s", range(20, 30))
    return before


def test_a_read_from_a_cut_before_a_scale_refuses_successors_truncated_since(store, scaled):
    successor = next(s for s in store.info("sc/s").segments if s.segment > 0 and s.head > 0)
    expected = (
        f"stream sc/s segment {successor.segment} was truncated at offset {successor.head}:"
        " position 0 is no longer readable"
    )
    with pytest.raises(Truncated, match=re.escape(expected)):
        list(store.read("sc/s", scaled))
    with pytest.raises(Truncated):
        list(store.read_batches("sc/s", scaled))
    # from the head, what is left reads whole
    assert [e.payload for e in store.read("sc/s")] == [f"k:{i}".encode() for i in range(20, 30)]


def test_a_reader_group_behind_a_scale_refuses_successors_truncated_since(store):
    store.create_stream("sc/g")
    write(store, "sc/g", range(5))
    group = store.reader_group("g", "sc/g")
    with group.reader("r") as reader:
        assert len(reader.read(100)) == 5
    store.split_segment("sc/g", 0, 2)
    write(store, "sc/g", range(5, 10))
    store.truncate(store.tail("sc/g"))  # events 5-9 are gone before the group saw them
    write(store, "sc/g", range(10, 15))
    with group.reader("r") as reader, pytest.raises(Truncated, match="position 0"):
        reader.read(100)
