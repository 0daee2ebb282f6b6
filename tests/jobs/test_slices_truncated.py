"""Slices a truncation has reached, slices that are no range of their stream, and slice
records no Sluice wrote: each is refused or named with what is wrong, never a traceback, a
count that is not true, or a path outside home."""

from __future__ import annotations

import json
import re

import pytest

from pipeline import cli
from pipeline.jobs.slices import (
    BadSliceRecord,
    SliceExtent,
    SliceRecord,
    list_slices,
    record_slices,
)
from pipeline.streams import InvalidCut

STREAM = "tr/s"


def write(store, seqs, key="k"):
    with store.writer(STREAM) as w:
        for i in seqs:
            w.write(f"{key}:{i}".encode(), routing_key=key)


def record(store, start, end, reason):
    """Record the slice of `STREAM` between two cuts."""
    made = SliceRecord.create(
        stream=STREAM,
        sensor=None,
        start_cut=start,
        end_cut=end,
        start_time_ns=0,
        end_time_ns=1,
        reason=reason,
        created_by="test",
    )
    record_slices(store, [made])
    return made


def test_slices_list_marks_a_truncated_slice_and_lists_the_others(store, store_dir, capsys):
    store.create_stream(STREAM)
    write(store, range(3))
    old = record(store, store.head(STREAM), store.tail(STREAM), "old")
    cut = store.tail(STREAM)
    write(store, range(3, 5))
    new = record(store, cut, store.tail(STREAM), "new")
    store.truncate(cut)
    store.close()
    base = ["--store", f"embedded:{store_dir}", "slices", "list", STREAM]
    assert cli.main(base) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].split()[:3] == [old.slice_id, "NULL", "truncated"]
    assert table[3].split()[:3] == [new.slice_id, "NULL", "2"]
    assert cli.main([*base, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[0]["truncated"] == (
        f"segment 0 was truncated at offset {cut.offset(0)}, past the slice's position 0"
    )
    assert (rows[0]["events"], rows[0]["bytes"]) == (None, None)
    assert (rows[1]["events"], "truncated" in rows[1]) == (2, False)


def test_a_slice_spanning_a_scale_is_truncated_when_its_successors_are(store):
    store.create_stream(STREAM)
    write(store, range(3))
    before = store.tail(STREAM)
    store.split_segment(STREAM, 0, 2)
    write(store, range(3, 6))
    spanning = record(store, before, store.tail(STREAM), "spanning")
    store.truncate(store.tail(STREAM))  # the successors' events of the slice are gone
    write(store, range(6, 9))
    extent = SliceExtent.of(store, spanning)
    assert (extent.events, extent.bytes) == (None, None)
    assert extent.truncated is not None and "past the slice's position 0" in extent.truncated


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"start_time_ns": "soon"}, 'start_time_ns is "soon", not a whole number'),
        ({"sensor": 7}, "sensor is 7, not a string or null"),
        ({"end_time_ns": True}, "end_time_ns is true, not a whole number"),
        (
            {"slice_id": "../../elsewhere"},
            "slice id '../../elsewhere' cannot name a directory: it starts with '.'",
        ),
    ],
)
def test_a_record_with_fields_of_the_wrong_kind_is_reported(store, changes, reason):
    store.create_stream(STREAM)
    write(store, range(1))
    good = SliceRecord.create(
        stream=STREAM,
        sensor=None,
        start_cut=store.head(STREAM),
        end_cut=store.tail(STREAM),
        start_time_ns=0,
        end_time_ns=1,
        reason="r",
        created_by="someone else",
    )
    store.create_stream("sluice/slices")
    with store.writer("sluice/slices") as w:
        w.write(json.dumps({**json.loads(good.to_json()), **changes}).encode(), STREAM)
    expected = f"event at sluice/slices segment 0 offset 0 is not a slice record: {reason}"
    with pytest.raises(BadSliceRecord, match=re.escape(expected)):
        list_slices(store)


def test_a_slice_whose_cuts_are_no_range_of_its_stream_is_refused(store):
    store.create_stream(STREAM)
    store.create_stream("tr/other")
    write(store, range(3))
    head, tail = store.head(STREAM), store.tail(STREAM)
    with pytest.raises(InvalidCut, match=re.escape("it is a cut of stream tr/other, not of tr/s")):
        record(store, store.head("tr/other"), tail, "another stream's cut")
    with pytest.raises(
        InvalidCut, match=r"slice sl-[0-9a-f]{16} ends before it starts, in segment 0"
    ):
        record(store, tail, head, "backwards")
    assert not store.stream_exists("sluice/slices"), "nothing was recorded"
    assert record(store, tail, tail, "empty").start_cut == tail.text  # an empty range is one
