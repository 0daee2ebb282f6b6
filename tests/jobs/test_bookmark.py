"""The bookmark job: known events of interest -> exactly the expected slices, tight cuts."""

from __future__ import annotations

import json
import re
import shutil

import pyarrow as pa
import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.bookmark import (
    BookmarkError,
    BookmarkSpec,
    Condition,
    process_batch,
    threshold,
)
from pipeline.jobs.slices import list_slices, record_slices
from pipeline.schemas import flatten_plan
from pipeline.streams import StaleCut, StreamCut
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_stream

CALM, BURST = [10] * 10, [50_000] * 10  # bytes per 1 ms sample: 0.08 vs 400 Mbit/s
PLAN = {
    "edge1": [CALM, BURST, BURST, CALM, BURST, CALM],
    "edge2": [CALM, CALM, CALM, BURST, CALM, CALM],
}
SECOND = 1_000_000_000


def early_rx(frame):
    """A predicate for the tests: rows whose RxBytes counter is between 50,000 and 400,000."""
    return frame["RxBytes"].between(50_000, 400_000)


def events_table(store, start=None, end=None) -> pa.Table:
    return source_rows(store.read(STREAM, start, end))


def source_rows(events) -> pa.Table:
    """Events as the `sluice` source's rows, as a bookmark batch gets them."""
    rows = [
        {
            "stream": e.stream,
            "segment": e.segment,
            "offset": e.offset,
            "end_offset": e.end_offset,
            "routing_key": e.routing_key,
            "payload": e.payload,
            "ingest_time": e.ingest_time_ns,
        }
        for e in events
    ]
    return pa.Table.from_pylist(rows)


def spec(store_dir, *conditions, sensor_by="routing_key") -> BookmarkSpec:
    return BookmarkSpec(
        STREAM, "NetworkSamples", f"embedded:{store_dir}", tuple(conditions), sensor_by
    )


def run_batches(store, bspec, root, batches: list[pa.Table]):
    plan = flatten_plan("NetworkSamples")
    closed = []
    for batch_id, batch in enumerate(batches):
        closed += process_batch(store, bspec, plan, root, batch_id=batch_id, events=batch)
    return closed


def test_bursts_become_exactly_the_expected_slices(store, store_dir, tmp_path):
    written = nic_stream(store, PLAN)
    bspec = spec(store_dir, Condition("burst", value=100.0))
    slices = run_batches(store, bspec, tmp_path / "state", [events_table(store)])
    by_key = {k: [w for w in written if w.key == k] for k in PLAN}
    expected = [("edge1", 1, 2), ("edge2", 3, 3), ("edge1", 4, 4)]  # (sensor, first, last)
    got = [(s.sensor, s.start_time_ns, s.end_time_ns) for s in slices]
    # an event's first sample is ~1 s after the previous event's last: its rate is low, so
    # the time of interest starts at each run's second sample
    assert sorted(got) == sorted(
        (k, by_key[k][a].t_min + MS, by_key[k][b].t_max) for k, a, b in expected
    )
    for record in slices:
        first, last = next(
            (by_key[record.sensor][a], by_key[record.sensor][b])
            for k, a, b in expected
            if k == record.sensor and by_key[k][a].t_min + MS == record.start_time_ns
        )
        start, end = record.cuts
        # tight: starts exactly at the first event of interest, ends right after the last
        assert start.offset(first.segment) == first.offset
        assert end.offset(last.segment) == last.end_offset
        inside = list(store.read(STREAM, start, end))
        mine = [e for e in inside if e.routing_key == record.sensor]
        assert mine[0].offset == first.offset and mine[-1].end_offset == last.end_offset
        others = [seg for seg, _ in start.positions if seg != first.segment]
        assert all(start.offset(seg) == end.offset(seg) for seg in others)  # empty ranges
    assert {s.reason for s in slices} == {"NIC rate above 100 Mbit/s"}


def test_a_slice_is_never_read_from_a_later_stream_of_its_name(store, store_dir, tmp_path):
    """Its cuts carry the stream's identity: once the stream is deleted and created again,
    reading the slice is `StaleCut`, not the new stream's events at the old offsets."""
    nic_stream(store, PLAN)
    bspec = spec(store_dir, Condition("burst", value=100.0))
    first = run_batches(store, bspec, tmp_path / "state", [events_table(store)])[0]
    assert StreamCut.parse(first.start_cut).stream_id == store.head(STREAM).stream_id
    store.seal_stream(STREAM)
    store.delete_stream(STREAM)
    nic_stream(store, PLAN)
    with pytest.raises(StaleCut, match="it is a cut of an earlier stream named"):
        list(store.read(STREAM, start=first.start_cut, end=first.end_cut))


def test_ids_are_stable_across_reruns_and_batch_boundaries(store, store_dir, tmp_path):
    nic_stream(store, PLAN)
    bspec = spec(store_dir, Condition("burst", value=100.0))
    whole = run_batches(store, bspec, tmp_path / "a", [events_table(store)])
    table = events_table(store)
    pieces = [table.slice(0, 3), table.slice(3, 4), table.slice(7)]
    split = run_batches(store, bspec, tmp_path / "b", pieces)
    assert sorted(s.slice_id for s in whole) == sorted(s.slice_id for s in split)
    assert record_slices(store, split) == []  # already recorded by the first run
    assert len(list_slices(store, STREAM)) == 3
    # a batch Spark runs again after a crash is a no-op
    plan = flatten_plan("NetworkSamples")
    assert process_batch(store, bspec, plan, tmp_path / "a", batch_id=0, events=table) == []


def truncate_before(store, written) -> None:
    """Truncate edge2's segment at its second event (a calm one: no slice starts before)."""
    edge2 = [w for w in written if w.key == "edge2"]
    head = store.head(STREAM)
    store.truncate(head.moved_to({**head.segments, edge2[1].segment: edge2[1].offset}))


def test_a_new_state_after_a_truncation_records_no_slice_twice(store, store_dir, tmp_path):
    """A checkpoint made again (another, or one that was lost) after the stream was truncated
    finds the slices it can still read again, with the segments they read nothing of at the
    stream's new head: other cuts and ids, the same slices. None is recorded twice."""
    written = nic_stream(store, PLAN)
    bspec = spec(store_dir, Condition("burst", value=100.0))
    first = run_batches(store, bspec, tmp_path / "a", [events_table(store)])
    truncate_before(store, written)
    again = run_batches(store, bspec, tmp_path / "b", [events_table(store, store.head(STREAM))])
    assert len(again) == 3 and {s.slice_id for s in again} != {s.slice_id for s in first}
    assert list_slices(store, STREAM) == list_slices(store) == first
    assert len(list(store.read("sluice/slices"))) == 3


def test_thresholds_predicates_and_sensor_columns(store, store_dir, tmp_path):
    written = nic_stream(store, PLAN)
    first = {k: [w for w in written if w.key == k] for k in PLAN}
    below = spec(store_dir, threshold("below", "RxBytes=500"), sensor_by="RemoteAddr,Interface")
    slices = run_batches(store, below, tmp_path / "a", [events_table(store)])
    # RxBytes counts up: edge1 is below 500 in its first event, edge2 in its first three
    assert sorted((s.sensor, s.sensor_by, s.end_time_ns) for s in slices) == [
        ("edge1/eth0", "RemoteAddr,Interface", first["edge1"][0].t_max),
        ("edge2/eth0", "RemoteAddr,Interface", first["edge2"][2].t_max),
    ]
    assert {s.reason for s in slices} == {"RxBytes < 500"}
    predicate = spec(store_dir, Condition("predicate", predicate=f"{__name__}:early_rx"))
    again = run_batches(store, predicate, tmp_path / "b", [events_table(store)])
    assert sorted((s.sensor, s.start_time_ns, s.end_time_ns) for s in again) == [
        ("edge1", first["edge1"][1].t_min, first["edge1"][1].t_min + 6 * MS),
        ("edge2", first["edge2"][3].t_min, first["edge2"][3].t_min + 6 * MS),
    ]
    with pytest.raises(BookmarkError, match=re.escape("expected FIELD=NUMBER")):
        threshold("below", "value")
    with pytest.raises(BookmarkError, match="give a condition"):
        run_batches(store, spec(store_dir), tmp_path / "c", [events_table(store)])


def test_a_run_open_at_the_end_stays_open(store, store_dir, tmp_path):
    nic_stream(store, {"edge1": [CALM, BURST]})
    bspec = spec(store_dir, Condition("burst", value=100.0))
    assert run_batches(store, bspec, tmp_path / "s", [events_table(store)]) == []
    state = json.loads(next((tmp_path / "s").glob("state-*.json")).read_text())
    assert list(state["runs"]) == ["edge1"]


@pytest.mark.spark
def test_sluice_run_bookmark_available_now(store, store_dir, monkeypatch, capsys):
    from pipeline.spark.session import SparkSettings, spark_session

    spark_session(SparkSettings(master="local[2]"))
    nic_stream(store, PLAN)
    argv = [
        "--store",
        f"embedded:{store_dir}",
        "run",
        "bookmark",
        "--stream",
        STREAM,
        "--schema",
        "NetworkSamples",
        "--burst-mbps",
        "100",
        "--available-now",
        "--max-events",
        "5",
    ]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["events"] == 12 and summary["batches"] >= 2
    found = list_slices(store, STREAM)
    assert sorted(s.sensor for s in found) == ["edge1", "edge1", "edge2"]
    assert all(s.created_by == "sluice run bookmark (bookmark)" for s in found)
    assert cli.main(argv) == 0  # caught up: nothing new, no duplicates
    capsys.readouterr()
    assert len(list_slices(store, STREAM)) == 3
    assert T0 <= min(s.start_time_ns for s in found) < T0 + 6 * SECOND


@pytest.mark.spark
def test_a_second_or_lost_checkpoint_records_no_slice_twice(
    spark, store, store_dir, tmp_path, capsys
):
    """`sluice run bookmark` from the head again, into the slices stream it filled: with
    another --checkpoint, with its own lost (the home deleted), and once more after the
    stream was truncated. Its slices have the ids (or the extent) of those recorded, so the
    slices stream keeps one record of each: harmless, nothing to refuse."""
    written = nic_stream(store, PLAN)
    argv = ["--store", f"embedded:{store_dir}", "run", "bookmark", "--stream", STREAM]
    argv += ["--schema", "NetworkSamples", "--burst-mbps", "100", "--available-now"]
    assert cli.main(argv) == 0
    recorded = list_slices(store, STREAM)
    assert len(recorded) == 3
    assert cli.main([*argv, "--checkpoint", str(tmp_path / "another")]) == 0
    shutil.rmtree(sluice_home() / "checkpoints")
    assert cli.main(argv) == 0
    truncate_before(store, written)
    assert cli.main([*argv, "--checkpoint", str(tmp_path / "after-truncation")]) == 0
    capsys.readouterr()
    assert list_slices(store, STREAM) == recorded
    assert len(list(store.read("sluice/slices"))) == 3
