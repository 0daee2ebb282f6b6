"""A small backlog runs as one batch in this process, without Spark, and Spark goes on from it.

Each job first runs batch 0 on Spark (a new checkpoint is always Spark's), then a small
backlog with a session factory that counts its calls, then more events through Spark again
(`in_process_bytes=0`): the output holds every event exactly once, and Spark's own later batch
starts where the in-process one ended. The in-process batch writes Spark's offset and commit
log entries as Spark does; a sink that fails hands its batch to Spark in the same run."""

from __future__ import annotations

import io
import json
import sqlite3
from dataclasses import replace

import pytest

from pipeline.jobs import export as export_job
from pipeline.jobs.bookmark import BookmarkSpec, Condition, bookmark, process_batch
from pipeline.jobs.checkpoint import settled_position
from pipeline.jobs.console import ConsoleSpec, console
from pipeline.jobs.export import ExportSpec, export, export_checkpoint
from pipeline.jobs.in_process import IN_PROCESS_ENV, default_in_process_bytes, range_rows
from pipeline.jobs.mirror import MirrorSpec, mirror
from pipeline.jobs.runner import RunOptions
from pipeline.jobs.slices import list_slices
from pipeline.schemas import flatten_plan
from pipeline.settings import SettingsError
from pipeline.spark.source import DATA_SOURCES
from tests.jobs.test_bookmark import BURST, CALM, events_table
from tests.jobs.test_caught_up import Sessions, exported, write_nic
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload, write_event
from tests.spark.conftest import fill

SMALL = RunOptions(in_process_bytes=1 << 20)
SPARK = RunOptions(in_process_bytes=0)


@pytest.fixture
def nics(store):
    store.create_stream("edge/network", segments=2)
    write_nic(store, range(20))
    return store


def export_spec(store_dir, tmp_path) -> ExportSpec:
    return ExportSpec("edge/network", "NetworkSamples", tmp_path / "out", f"embedded:{store_dir}")


@pytest.mark.spark
def test_a_small_export_backlog_runs_without_spark_and_spark_goes_on_from_it(
    spark, nics, store_dir, tmp_path
):
    spec = export_spec(store_dir, tmp_path)
    sessions = Sessions(spark)
    first = export(sessions, spec, SPARK)
    write_nic(nics, range(20, 25))
    small = export(sessions, spec, SMALL)
    assert sessions.calls == 1
    [batch] = small.batches
    assert (batch.batch_id, batch.events, batch.rows) == (1, 5, 50)
    assert (small.start_cut, small.end_cut) == (first.end_cut, nics.tail("edge/network").text)
    assert exported(spec.output) == (250, 250)

    root = export_checkpoint(spec)
    spark_dir = root / "spark"
    planned = (spark_dir / "offsets" / "0").read_text().splitlines()
    ours = (spark_dir / "offsets" / "1").read_text().splitlines()
    assert ours[0] == planned[0] == "v1"
    # Spark's settings for this query, as it recorded them for batch 0; a later time
    spark_meta, our_meta = json.loads(planned[1]), json.loads(ours[1])
    assert our_meta["conf"] == spark_meta["conf"]
    assert our_meta["batchTimestampMs"] >= spark_meta["batchTimestampMs"]
    assert json.loads(ours[2]) == {"cut": small.end_cut}
    assert (spark_dir / "commits" / "1").read_text() == (spark_dir / "commits" / "0").read_text()
    assert settled_position(root).batch_id == 1

    write_nic(nics, range(25, 30))
    later = export(sessions, spec, SPARK)
    assert sessions.calls == 2
    assert [(b.batch_id, b.events) for b in later.batches] == [(2, 5)]
    assert later.start_cut == small.end_cut
    assert exported(spec.output) == (300, 300)


@pytest.mark.spark
@pytest.mark.parametrize("crash", ["before the commit entry", "while publishing"])
def test_a_batch_left_planned_is_finished_in_process_over_its_own_cuts(
    spark, nics, store_dir, tmp_path, crash
):
    """What a kill leaves after the offset log entry of batch 1 (and, while publishing, the
    ledger's intent): the next small run re-runs batch 1 over the cuts it was planned with,
    without Spark, then the events that came since as batch 2; every sample once."""
    spec = export_spec(store_dir, tmp_path)
    sessions = Sessions(spark)
    export(sessions, spec, SPARK)
    write_nic(nics, range(20, 25))
    planned = export(sessions, spec, SMALL)
    root = export_checkpoint(spec)
    (root / "spark" / "commits" / "1").unlink()
    if crash == "while publishing":
        with sqlite3.connect(root / "ledger.sqlite") as db:
            db.execute("UPDATE batches SET state = 'intent', stats = NULL WHERE batch_id = 1")
    write_nic(nics, range(25, 28))
    resumed = export(sessions, spec, SMALL)
    assert sessions.calls == 1
    assert [(b.batch_id, b.start_cut, b.end_cut) for b in resumed.batches] == [
        (1, planned.start_cut, planned.end_cut),
        (2, planned.end_cut, nics.tail("edge/network").text),
    ]
    assert [b.events for b in resumed.batches] == [5, 3]
    assert not any(b.spark for b in resumed.batches)
    assert exported(spec.output) == (280, 280)


@pytest.mark.spark
def test_a_backlog_above_the_limit_a_batch_limit_or_a_scale_goes_to_spark(
    spark, nics, store_dir, tmp_path
):
    spec = export_spec(store_dir, tmp_path)
    sessions = Sessions(spark)
    export(sessions, spec, SPARK)
    write_nic(nics, range(20, 25))
    export(sessions, spec, RunOptions(in_process_bytes=100))  # 5 events are more bytes
    assert sessions.calls == 2
    write_nic(nics, range(25, 30))
    export(sessions, spec, replace(SMALL, max_events=2))  # batches of 2: Spark's to plan
    assert sessions.calls == 3
    nics.scale("edge/network", seal=[1], ranges=[(0.5, 0.75), (0.75, 1.0)])
    write_nic(nics, range(30, 35))
    export(sessions, spec, SMALL)  # new segments: Spark plans them
    assert sessions.calls == 4
    assert exported(spec.output) == (350, 350)


@pytest.mark.spark
def test_a_sink_that_fails_in_process_hands_its_batch_to_spark_in_the_same_run(
    spark, nics, store_dir, tmp_path, monkeypatch
):
    """The in-process batch wrote its files and died before publishing them: batch 1 is
    planned and uncommitted, and Spark re-runs it over the same cuts in the same run."""
    spec = export_spec(store_dir, tmp_path)
    sessions = Sessions(spark)
    export(sessions, spec, SPARK)
    real = export_job.stream_writer_batch

    def failing(format_name, options):
        def run(batch_id, ranges):
            writer = DATA_SOURCES[format_name](options).streamWriter(None, False)
            writer.write(iter([range_rows(ranges)]))  # staged, never published
            message = "disk went away"
            raise OSError(message)

        return run

    monkeypatch.setattr(export_job, "stream_writer_batch", failing)
    write_nic(nics, range(20, 25))
    recovered = export(sessions, spec, SMALL)
    assert sessions.calls == 2
    assert [(b.batch_id, b.events) for b in recovered.batches] == [(1, 5)]
    assert exported(spec.output) == (250, 250)
    monkeypatch.setattr(export_job, "stream_writer_batch", real)
    write_nic(nics, range(25, 30))
    assert export(sessions, spec, SMALL).events == 5
    assert sessions.calls == 2
    assert exported(spec.output) == (300, 300)


@pytest.mark.spark
@pytest.mark.parametrize("commit_mode", ["tasks", "driver"])
def test_a_small_mirror_backlog_copies_once_in_order_without_spark(
    spark, store, store_dir, commit_mode
):
    uri = f"embedded:{store_dir}"
    store.create_stream("edge/network", segments=2)
    fill(store, "edge/network", 30)
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri, commit_mode=commit_mode)
    sessions = Sessions(spark)
    mirror(sessions, spec, SPARK)
    fill(store, "edge/network", 12, first=30)
    assert mirror(sessions, spec, SMALL).events == 12
    assert sessions.calls == 1
    fill(store, "edge/network", 8, first=42)
    assert mirror(sessions, spec, SPARK).events == 8
    assert sessions.calls == 2
    source, copied = list(store.read("edge/network")), list(store.read("cloud/network"))
    assert sorted(e.payload for e in copied) == sorted(e.payload for e in source)
    for key in {e.routing_key for e in source}:
        sent = [e.payload for e in source if e.routing_key == key]
        assert [e.payload for e in copied if e.routing_key == key] == sent


@pytest.mark.spark
def test_a_small_bookmark_backlog_records_the_slices_spark_would(spark, store, store_dir, tmp_path):
    """Batch 0 (one calm event per host) through Spark, the rest without it: the same slices,
    same ids and cuts, as one pass over the whole stream."""
    store.create_stream(STREAM, segments=2)
    plan = {"edge1": [CALM, BURST, BURST, CALM, BURST, CALM], "edge2": [CALM, CALM, BURST, CALM]}
    counters = dict.fromkeys(plan, 0)

    def write_round(k: int) -> None:
        for host, events in plan.items():
            if k < len(events):
                t0 = T0 + k * 1000 * MS
                payload = nic_payload(host, t0, counters[host], events[k])
                counters[host] += sum(events[k])
                write_event(store, host, payload, (t0, t0 + (len(events[k]) - 1) * MS))

    uri = f"embedded:{store_dir}"
    spec = BookmarkSpec(STREAM, "NetworkSamples", uri, (Condition("burst", value=100.0),))
    sessions = Sessions(spark)
    write_round(0)
    bookmark(sessions, spec, SPARK)
    for k in range(1, 6):
        write_round(k)
    small = bookmark(sessions, spec, SMALL)
    assert (sessions.calls, small.events) == (1, 8)
    recorded = sorted((s.slice_id, s.cuts) for s in list_slices(store, STREAM))

    whole = process_batch(
        store,
        replace(spec, slices_stream="check/slices"),
        flatten_plan("NetworkSamples"),
        tmp_path / "whole",
        batch_id=0,
        events=events_table(store),
    )
    assert len(recorded) == 3
    assert recorded == sorted((s.slice_id, s.cuts) for s in whole)


@pytest.mark.spark
def test_a_small_console_backlog_prints_the_lines_spark_would(spark, store, store_dir, tmp_path):
    """The same events printed by Spark (one checkpoint) and, after a Spark batch 0, in
    process (another checkpoint): the same lines."""
    store.create_stream("edge/net", segments=2)

    def write(events: range) -> None:
        with store.writer("edge/net") as writer:
            for i in events:
                writer.write(f'{{"n": {i}}}'.encode(), routing_key=f"k{i % 3}")

    def printed(run: RunOptions, checkpoint: str) -> tuple[list[str], tuple]:
        out = io.StringIO()
        spec = ConsoleSpec("edge/net", f"embedded:{store_dir}")
        summary = console(sessions, spec, replace(run, checkpoint=tmp_path / checkpoint), out=out)
        return out.getvalue().splitlines(), summary.batches

    sessions = Sessions(spark)
    write(range(4))
    printed(SPARK, "small")
    write(range(4, 12))
    small, batches = printed(SMALL, "small")
    assert sessions.calls == 1
    assert [(b.batch_id, b.events, b.spark) for b in batches] == [(1, 8, False)]
    everything, _ = printed(SPARK, "spark")
    assert sessions.calls == 2
    later = [line for line in everything if int(line.rsplit(": ", 1)[1].rstrip("}")) >= 4]
    assert sorted(small) == sorted(later) and len(small) == 8


def test_the_default_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(IN_PROCESS_ENV, "1000")
    assert default_in_process_bytes() == 1000
    monkeypatch.delenv(IN_PROCESS_ENV)
    assert default_in_process_bytes() == 32 << 20
    assert RunOptions().in_process_bytes is None  # read when a run starts, not before
    assert "--in-process-bytes" not in RunOptions().flags()
    assert RunOptions(in_process_bytes=0).flags() == ["--in-process-bytes", "0"]
    for bad in ("-1", "lots", ""):
        monkeypatch.setenv(IN_PROCESS_ENV, bad)
        with pytest.raises(SettingsError, match=IN_PROCESS_ENV):
            default_in_process_bytes()
