"""A checkpoint's progress, read without its lock: last committed batch, end cut, ledger totals.

The directory is built by hand in the layout Spark and the sinks write (`spark/commits/N`,
`spark/offsets/N` in offset-log format v1, `ledger.sqlite`), so no Spark session is needed.
"""

from __future__ import annotations

import json
import re

import pytest

from pipeline.jobs.checkpoint import (
    BatchTotals,
    Checkpoint,
    JobIdentity,
    UnreadableCheckpoint,
    batch_end_cut,
    committed_progress,
    ledger_totals,
)
from pipeline.jobs.runner import JobSource, RunOptions, resolve_start
from pipeline.spark.ledger import LEDGER_VERSION, BatchLedger
from pipeline.streams import StreamCut, open_store

from .conftest import cut_short_write

CUTS = [StreamCut.of("edge", "net", {0: 100 * (n + 1), 1: 50 * (n + 1)}) for n in range(3)]


def write_batch(root, batch_id: int, *, committed: bool = True) -> None:
    offsets = root / "spark" / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0}
    lines = ["v1", json.dumps(metadata), json.dumps({"cut": CUTS[batch_id].text})]
    (offsets / str(batch_id)).write_text("\n".join(lines) + "\n")
    if committed:
        commits = root / "spark" / "commits"
        commits.mkdir(parents=True, exist_ok=True)
        (commits / str(batch_id)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def record(ledger: BatchLedger, batch_id: int, stats: dict | None) -> None:
    plan = {"version": LEDGER_VERSION, "kind": "files", "items": [], "stats": {}}
    ledger.record(batch_id, plan)
    if stats is not None:
        ledger.finish(batch_id, stats)


def test_no_progress_before_the_first_commit(tmp_path):
    assert committed_progress(tmp_path) is None
    write_batch(tmp_path, 0, committed=False)  # planned, not committed
    assert committed_progress(tmp_path) is None


def test_the_last_committed_batch_and_its_end_cut(tmp_path):
    write_batch(tmp_path, 0)
    write_batch(tmp_path, 1)
    write_batch(tmp_path, 2, committed=False)
    progress = committed_progress(tmp_path)
    assert progress is not None
    assert (progress.batch_id, progress.end_cut) == (1, CUTS[1])
    assert batch_end_cut(tmp_path, 2) == CUTS[2]


def test_an_offset_log_of_another_format_is_refused_with_its_path(tmp_path):
    write_batch(tmp_path, 0)
    path = tmp_path / "spark" / "offsets" / "0"
    path.write_text("v2\n{}\n{}\n")
    with pytest.raises(UnreadableCheckpoint, match=re.escape(f"{path} is not a v1 offset log")):
        committed_progress(tmp_path)
    path.write_text('v1\n{}\n{"position": 3}\n')
    with pytest.raises(UnreadableCheckpoint, match="no stream cut in its source offset"):
        batch_end_cut(tmp_path, 0)


def test_ledger_totals_add_up_the_done_batches_in_the_range(tmp_path):
    assert ledger_totals(tmp_path, -1, 10) == BatchTotals()  # no ledger yet
    with BatchLedger(tmp_path / "ledger.sqlite") as ledger:
        record(ledger, 0, {"events": 5, "rows": 50, "files": ["a"], "min_event_time_ns": 7})
        record(ledger, 1, {"events": 3, "quarantined": 1, "bytes": 10, "max_event_time_ns": 9})
        record(ledger, 2, None)  # an intent: not published yet
        record(ledger, 3, {"events": 100})
    totals = ledger_totals(tmp_path, -1, 2)
    assert totals == BatchTotals(
        batches=2,
        events=8,
        rows=53,  # a batch without a row count counts its events
        quarantined=1,
        bytes=10,
        files=("a",),
        min_event_time_ns=7,
        max_event_time_ns=9,
    )
    assert ledger_totals(tmp_path, 0, 3).events == 103


@pytest.mark.parametrize("sources", [1, 2])
def test_a_start_resolved_on_a_new_checkpoint_holds_for_every_later_run(tmp_path, sources):
    """`--from tail` is resolved once per source and recorded: a run killed before Spark
    committed batch 0 leaves the checkpoint new, and the next run must start where the first
    one did, not at the tail that has moved on since (its events would never be read)."""
    store = f"embedded:{tmp_path / 'streams'}"
    streams = ["edge/left", "edge/right"][:sources]
    with open_store(store) as opened:
        for stream in streams:
            opened.create_stream(stream)
            with opened.writer(stream) as writer:
                writer.write(b"history", routing_key="k")
    identity = JobIdentity("join", "both", "out")
    run = RunOptions(starting="tail")
    sources_ = [JobSource(store, stream) for stream in streams]

    def starts() -> list[str]:
        with Checkpoint(tmp_path / "ck", identity) as checkpoint:
            return [
                resolve_start(checkpoint, run, source, (i, sources)).starting
                for i, source in enumerate(sources_)
            ]

    first = starts()
    with open_store(store) as opened:
        assert first == [opened.tail(stream).text for stream in streams]
        for stream in streams:
            with opened.writer(stream) as writer:
                writer.write(b"after the start", routing_key="k")
    assert starts() == first


def test_a_first_offset_write_cut_short_leaves_a_new_checkpoint_that_spark_takes(tmp_path):
    # Spark 4.1 on refuses a new query where offsets/ or commits/ holds any file at all:
    # every later run of the job failed (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
    identity = JobIdentity("mirror", "embedded:/e#edge/net", "embedded:/c#cloud/net")
    debris = cut_short_write(tmp_path / "spark" / "offsets", 0)
    checkpoint = Checkpoint(tmp_path, identity)
    assert checkpoint.is_new
    with checkpoint:
        assert not any(path.exists() for path in debris)
        assert (tmp_path / "spark" / "offsets").is_dir()
        assert checkpoint.is_new


def test_a_temporary_file_beside_planned_batches_is_left_to_spark(tmp_path):
    identity = JobIdentity("mirror", "embedded:/e#edge/net", "embedded:/c#cloud/net")
    write_batch(tmp_path, 0)
    debris = cut_short_write(tmp_path / "spark" / "offsets", 1)
    debris += cut_short_write(tmp_path / "spark" / "commits", 1)
    with Checkpoint(tmp_path, identity) as checkpoint:
        assert not checkpoint.is_new
    assert all(path.exists() for path in debris)  # Spark reads batch files only
    assert (tmp_path / "spark" / "offsets" / "0").exists()
