"""`sluice run join`: the streaming join over two series of a stream, exactly once."""

from __future__ import annotations

import itertools
import json

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.jobs.stream_join import SeriesSource, StreamJoinSpec, process_batch
from pipeline.schemas import Events, flatten, flatten_plan
from pipeline.timejoin import SeriesOutOfOrder, join_tables
from tests.jobs.test_bookmark import events_table
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload, write_event

PLAN = flatten_plan("NetworkSamples")


def two_series(store, events: int = 6) -> None:
    """edge1 samples every 1 ms, edge2 every 1.5 ms from +0.3 ms: pairs of every kind."""
    store.create_stream(STREAM, segments=2)
    for k in range(events):
        for host, step, shift in (("edge1", MS, 0), ("edge2", 3 * MS // 2, 3 * MS // 10)):
            t0 = T0 + k * 20 * MS + shift
            payload = nic_payload(host, t0, 0, [1] * 10, step_ns=step)
            write_event(store, host, payload, (t0, t0 + 9 * step))


def expected_final(store, spec) -> pa.Table:
    """The batch join of both whole sides, keeping only pairs final at the end."""
    sides = []
    for source in (spec.left, spec.right):
        events = source.select(events_table(store))
        sides.append(flatten(PLAN, Events.from_arrow(events)).rows)
    table = join_tables(sides[0], sides[1], time_column="TimestampNanos").table
    horizon = min(pc.max(s["TimestampNanos"]).as_py() for s in sides)
    completion = pc.max_element_wise(table["left_TimestampNanos"], table["right_TimestampNanos"])
    return table.filter(pc.less(completion, horizon))


def parts(output) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted(output.glob("part-*.parquet")))


def spec_for(store_dir, output) -> StreamJoinSpec:
    return StreamJoinSpec(
        SeriesSource.parse(f"{STREAM}#edge1"),
        SeriesSource.parse(f"{STREAM}#edge2"),
        "NetworkSamples",
        f"embedded:{store_dir}",
        output,
    )


@pytest.mark.parametrize("cuts", [[12], [1, 5, 9], [2, 3, 4, 7, 11]])
def test_any_batching_gives_the_batch_join(store, store_dir, tmp_path, cuts):
    two_series(store)
    spec = spec_for(store_dir, tmp_path / "out")
    events = events_table(store)
    bounds = [0, *cuts, events.num_rows]
    for batch_id, (a, b) in enumerate(itertools.pairwise(bounds)):
        process_batch(spec, PLAN, tmp_path / "state", batch_id, events.slice(a, b - a))
    assert parts(spec.output).equals(expected_final(store, spec))


def test_a_batch_run_again_after_a_crash_changes_nothing(store, store_dir, tmp_path):
    two_series(store)
    spec = spec_for(store_dir, tmp_path / "out")
    events = events_table(store)
    process_batch(spec, PLAN, tmp_path / "state", 0, events.slice(0, 6))
    before = {p.name: p.read_bytes() for p in spec.output.glob("part-*")}
    assert process_batch(spec, PLAN, tmp_path / "state", 0, events.slice(0, 6)) == 0
    assert {p.name: p.read_bytes() for p in spec.output.glob("part-*")} == before


def test_a_side_going_back_in_time_stops_the_job(store, store_dir, tmp_path):
    two_series(store, events=2)
    spec = spec_for(store_dir, tmp_path / "out")
    left = spec.left.select(events_table(store)).sort_by("offset")
    process_batch(spec, PLAN, tmp_path / "state", 0, left.slice(1, 1))  # the later event first
    with pytest.raises(SeriesOutOfOrder, match="the left series went back in time"):
        process_batch(spec, PLAN, tmp_path / "state", 1, left.slice(0, 1))


def join_argv(store_dir, out, max_events: int) -> list[str]:
    """`sluice run join` of the two series `two_series` writes, into `out`."""
    store = f"embedded:{store_dir}"
    sides = ["--left", f"{STREAM}#edge1", "--right", f"{STREAM}#edge2"]
    rest = ["--schema", "NetworkSamples", "--output", str(out), "--available-now"]
    return ["--store", store, "run", "join", *sides, *rest, "--max-events", str(max_events)]


@pytest.mark.spark
def test_sluice_run_join(store, store_dir, tmp_path, monkeypatch, capsys):
    from pipeline.spark.session import SparkSettings, spark_session

    spark_session(SparkSettings(master="local[2]"))
    two_series(store)
    out = tmp_path / "joined"
    argv = join_argv(store_dir, out, 4)
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["events"] == 12 and summary["batches"] >= 3
    assert parts(out).equals(expected_final(store, spec_for(store_dir, out)))
