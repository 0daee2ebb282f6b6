"""A run until caught up that finds nothing new decides so from its checkpoint and the store,
before Spark starts; anything in doubt, or any new event, still goes through Spark.

The first half builds checkpoints by hand in the layout Spark and the sinks write (as
`test_checkpoint.py` does) over a real embedded store; the second runs the jobs on Spark and
then hands them a session factory that counts its calls, so a test sees whether Spark was
asked for at all."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from pipeline.jobs.checkpoint import (
    Checkpoint,
    InDoubt,
    JobIdentity,
    settled_position,
)
from pipeline.jobs.export import ExportSpec, export, export_checkpoint
from pipeline.jobs.mirror import MirrorSpec, mirror
from pipeline.jobs.runner import JobSource, RunOptions, caught_up
from pipeline.spark.ledger import LEDGER_VERSION, BatchLedger
from pipeline.streams import StreamCut, StreamStore
from tests.jobs.test_export import nic
from tests.spark.conftest import fill

REPO = Path(__file__).resolve().parents[2]
T0 = 1_609_362_000_000_000_000
IDENTITY = JobIdentity("mirror", "edge#edge/network", "cloud#cloud/network")


def write_batch(root: Path, batch_id: int, *cuts: StreamCut, committed: bool = True) -> None:
    """Batch `batch_id` in Spark's offset log (one line per source) and, if committed, its
    commit file."""
    offsets = root / "spark" / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0})]
    lines += [json.dumps({"cut": cut.text}) for cut in cuts]
    (offsets / str(batch_id)).write_text("\n".join(lines) + "\n")
    if committed:
        commits = root / "spark" / "commits"
        commits.mkdir(parents=True, exist_ok=True)
        (commits / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def ledger_batch(root: Path, batch_id: int, *, done: bool) -> None:
    plan = {"version": LEDGER_VERSION, "kind": "txns", "items": [], "stats": {}}
    with BatchLedger(root / "ledger.sqlite") as ledger:
        ledger.record(batch_id, plan)  # type: ignore[arg-type]
        if done:
            ledger.finish(batch_id, {"events": 1})


def cut(offset: int, stream: str = "network") -> StreamCut:
    return StreamCut.of("edge", stream, {0: offset, 1: 0})


# --- where a checkpoint stands: settled, or in doubt ---------------------------------------


def test_a_checkpoint_settles_at_its_last_committed_batch(tmp_path):
    write_batch(tmp_path, 0, cut(10))
    write_batch(tmp_path, 1, cut(20))
    ledger_batch(tmp_path, 0, done=True)
    ledger_batch(tmp_path, 1, done=True)
    position = settled_position(tmp_path)
    assert (position.batch_id, position.end_cuts) == (1, (cut(20),))


def test_a_checkpoint_of_two_sources_has_an_end_cut_for_each(tmp_path):
    write_batch(tmp_path, 0, cut(10), cut(5, "power"))
    assert settled_position(tmp_path).end_cuts == (cut(10), cut(5, "power"))


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("new", "no batch committed yet"),
        ("planned", "Spark planned up to batch 1 and committed up to batch 0"),
        ("intent", "the ledger holds batch 1 as intent; Spark committed up to 1"),
        ("ledger ahead", "the ledger holds batch 1 as done; Spark committed up to 0"),
    ],
)
def test_a_batch_not_finished_everywhere_is_in_doubt(tmp_path, state, reason):
    if state != "new":
        write_batch(tmp_path, 0, cut(10))
        ledger_batch(tmp_path, 0, done=True)
    if state == "planned":  # the driver died before Spark's commit log had batch 1
        write_batch(tmp_path, 1, cut(20), committed=False)
    if state == "intent":  # the sink recorded batch 1 and died publishing it
        write_batch(tmp_path, 1, cut(20))
        ledger_batch(tmp_path, 1, done=False)
    if state == "ledger ahead":  # the sink finished batch 1, Spark did not record it
        ledger_batch(tmp_path, 1, done=True)
    with pytest.raises(InDoubt, match=re.escape(reason)):
        settled_position(tmp_path)


# --- caught up: settled, and every source's tail where the last batch ended ---------------


@pytest.fixture
def edge(store: StreamStore) -> StreamStore:
    store.create_stream("edge/network", segments=2)
    fill(store, "edge/network", 30)
    return store


def test_caught_up_only_while_the_tail_is_where_the_last_batch_ended(edge, store_dir, tmp_path):
    source = JobSource(f"embedded:{store_dir}", "edge/network")
    root = tmp_path / "ck"
    with Checkpoint(root, IDENTITY) as checkpoint:
        assert caught_up(checkpoint, [source], RunOptions()) is None  # new: Spark plans batch 0
        write_batch(root, 0, edge.tail("edge/network"))
        position = caught_up(checkpoint, [source], RunOptions())
        assert position is not None and position.end_cuts == (edge.tail("edge/network"),)
        assert caught_up(checkpoint, [source], RunOptions(mode="continuous")) is None
        fill(edge, "edge/network", 1, first=30)
        assert caught_up(checkpoint, [source], RunOptions()) is None


def test_a_segment_added_by_a_scale_is_not_caught_up(edge, store_dir, tmp_path):
    """A new segment is empty but part of the tail: Spark records it in a batch of its own."""
    source = JobSource(f"embedded:{store_dir}", "edge/network")
    with Checkpoint(tmp_path / "ck", IDENTITY) as checkpoint:
        write_batch(checkpoint.root, 0, edge.tail("edge/network"))
        edge.scale("edge/network", seal=[1], ranges=[(0.5, 0.75), (0.75, 1.0)])
        assert caught_up(checkpoint, [source], RunOptions()) is None


def test_a_checkpoint_of_another_stream_or_a_missing_one_is_left_to_spark(
    edge, store_dir, tmp_path
):
    uri = f"embedded:{store_dir}"
    with Checkpoint(tmp_path / "ck", IDENTITY) as checkpoint:
        write_batch(checkpoint.root, 0, edge.tail("edge/network"))
        assert caught_up(checkpoint, [JobSource(uri, "edge/other")], RunOptions()) is None
        edge.seal_stream("edge/network")
        edge.delete_stream("edge/network")
        assert caught_up(checkpoint, [JobSource(uri, "edge/network")], RunOptions()) is None


# --- the jobs: no Spark when caught up; new events and unfinished batches through Spark ---


class Sessions:
    """A session factory that counts how often a job asked for Spark."""

    def __init__(self, spark) -> None:
        self.spark, self.calls = spark, 0

    def __call__(self):
        self.calls += 1
        return self.spark


def exported(output: Path) -> tuple[int, int]:
    """Rows of the published Parquet files, and distinct (segment, offset, sample) among them."""
    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = f"SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) FROM '{glob}'"
    return duckdb.connect().execute(query).fetchall()[0]


def write_nic(store: StreamStore, events: range) -> None:
    with store.writer("edge/network") as writer:
        for i in events:
            writer.write(nic(i, 10, T0 + i * 10**9), routing_key=f"eth{i % 2}")


@pytest.fixture
def nics(store: StreamStore) -> StreamStore:
    store.create_stream("edge/network", segments=2)
    write_nic(store, range(20))
    return store


@pytest.mark.spark
def test_a_caught_up_export_asks_for_no_spark_and_later_events_export_once(
    spark, nics, store_dir, tmp_path
):
    spec = ExportSpec("edge/network", "NetworkSamples", tmp_path / "out", f"embedded:{store_dir}")
    sessions = Sessions(spark)
    first = export(sessions, spec, RunOptions())
    idle = export(sessions, spec, RunOptions())
    assert (first.events, sessions.calls) == (20, 1)
    assert (idle.batches, sessions.calls) == ((), 1)
    assert exported(spec.output) == (200, 200)

    write_nic(nics, range(20, 25))
    later = export(sessions, spec, RunOptions())
    assert (later.events, later.start_cut, sessions.calls) == (5, first.end_cut, 2)
    assert export(sessions, spec, RunOptions()).batches == ()
    assert sessions.calls == 2
    assert exported(spec.output) == (250, 250)


@pytest.mark.spark
@pytest.mark.parametrize("crash", ["before Spark's commit", "while publishing"])
def test_an_unfinished_batch_is_recovered_by_spark_not_skipped(
    spark, nics, store_dir, tmp_path, crash
):
    """The state a driver leaves when it dies after the sink published batch 1 (or while
    it published: the ledger still says intent) and before Spark recorded the commit: the
    tail is where batch 1 ends, but batch 1 is Spark's to finish."""
    spec = ExportSpec("edge/network", "NetworkSamples", tmp_path / "out", f"embedded:{store_dir}")
    sessions = Sessions(spark)
    export(sessions, spec, RunOptions())
    write_nic(nics, range(20, 25))
    export(sessions, spec, RunOptions())
    root = export_checkpoint(spec)
    for name in ("1", ".1.crc"):  # Spark writes the file and its checksum
        (root / "spark" / "commits" / name).unlink()
    if crash == "while publishing":
        with sqlite3.connect(root / "ledger.sqlite") as db:
            db.execute("UPDATE batches SET state = 'intent', stats = NULL WHERE batch_id = 1")

    recovered = export(sessions, spec, RunOptions())
    assert sessions.calls == 3
    assert [b.batch_id for b in recovered.batches] == [1]
    assert (root / "spark" / "commits" / "1").exists()
    assert settled_position(root).batch_id == 1
    assert exported(spec.output) == (250, 250)
    assert export(sessions, spec, RunOptions()).batches == ()
    assert sessions.calls == 3


@pytest.mark.spark
def test_a_caught_up_mirror_asks_for_no_spark_and_copies_later_events_once(spark, edge, store_dir):
    uri = f"embedded:{store_dir}"
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri)
    sessions = Sessions(spark)
    mirror(sessions, spec, RunOptions())
    assert mirror(sessions, spec, RunOptions()).batches == ()
    assert sessions.calls == 1
    fill(edge, "edge/network", 12, first=30)
    assert mirror(sessions, spec, RunOptions()).events == 12
    assert mirror(sessions, spec, RunOptions()).batches == ()
    assert sessions.calls == 2
    copied = sorted(e.payload for e in edge.read("cloud/network"))
    assert copied == sorted(e.payload for e in edge.read("edge/network"))


@pytest.mark.spark
def test_sluice_run_export_when_caught_up_never_imports_pyspark(spark, nics, store_dir, tmp_path):
    spec = ExportSpec("edge/network", "NetworkSamples", tmp_path / "out", f"embedded:{store_dir}")
    export(spark, spec, RunOptions())
    argv = ["--store", spec.store, "run", "export", "--stream", spec.stream]
    argv += ["--schema", spec.schema, "--output", str(spec.output)]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipeline.cli", *argv],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines()}
    assert "pipeline.jobs.export" in imported
    assert not {m for m in imported if m.split(".")[0] in ("pyspark", "py4j")}
    summary = json.loads(done.stdout)
    assert (summary["batches"], summary["events"]) == (0, 0)
    assert exported(spec.output) == (200, 200)
