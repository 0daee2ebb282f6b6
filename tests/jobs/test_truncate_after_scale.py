"""A truncation that reaches past a job's checkpoint or into a slice, after a scale or not:
the job fails at once with what was dropped and how to go on, and a replay is refused before
Spark starts. Never a silent skip of the successor segments' dropped events (a cut taken
before a scale does not name them: they are read from offset 0, not from their head)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.mirror import MirrorSpec, TargetTaken, mirror
from pipeline.jobs.replay import SliceTruncated, load_model, replay
from pipeline.jobs.runner import JobFailed, RunOptions
from pipeline.jobs.slices import SliceRecord, record_slices
from pipeline.schemas import flatten_plan
from pipeline.streams import StreamCut
from tests.jobs.test_caught_up import Sessions
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload, write_event
from tests.spark.conftest import fill

SOURCE = "edge/scaled"
TARGET = "cloud/scaled"
SECOND = 1_000_000_000


def seqs(store, stream: str) -> list[int]:
    """The `seq` of every event of `stream`, sorted (duplicates kept)."""
    return sorted(json.loads(e.payload)["seq"] for e in store.read(stream))


@pytest.mark.spark
@pytest.mark.parametrize("max_events", [None, 4])
def test_a_mirror_past_a_scale_and_a_truncation_fails_rather_than_skipping(
    spark, store, store_dir, tmp_path, max_events
):
    """Events 10-19 go into the successors of a split, then a truncation at the tail drops
    them: the checkpoint (from before the split) must not go on with 20-29 as if they were
    next. Spark plans the batch (`plan_ranges`) or admits it (`admit`, with --max-events)."""
    uri = f"embedded:{store_dir}"
    store.create_stream(SOURCE)
    fill(store, SOURCE, 10)
    spec = MirrorSpec(SOURCE, TARGET, uri, uri)
    run = RunOptions(checkpoint=tmp_path / "ck", max_events=max_events)
    assert mirror(spark, spec, run).events == 10
    store.split_segment(SOURCE, 0)
    fill(store, SOURCE, 10, first=10)
    store.truncate(store.tail(SOURCE))
    fill(store, SOURCE, 10, first=20)
    with pytest.raises(
        JobFailed, match=f"stream {SOURCE} segment [12] was truncated at offset"
    ) as failed:
        mirror(spark, spec, run)
    resume = re.search(r"--from (\S+)$", str(failed.value))
    assert seqs(store, TARGET) == list(range(10))
    # a new checkpoint from the head would be refused (the target holds events: copying the
    # head again could copy them twice); one from where the failure says copies what remains
    fresh = RunOptions(checkpoint=tmp_path / "new", max_events=max_events)
    with pytest.raises(TargetTaken, match=f"{TARGET} holds 10 events already"):
        mirror(spark, spec, fresh)
    fresh = replace(fresh, starting=resume.group(1))
    assert mirror(spark, spec, fresh).events == 10
    assert seqs(store, TARGET) == [*range(10), *range(20, 30)]


@pytest.mark.spark
def test_a_truncation_met_in_process_fails_the_run_at_once_without_spark(
    spark, store, store_dir, tmp_path
):
    """A small backlog runs in this process; its read meets the truncation: the run fails
    with the job's one line, and Spark is not started to fail the same way seconds later."""
    uri = f"embedded:{store_dir}"
    store.create_stream(SOURCE)
    fill(store, SOURCE, 10)
    spec = MirrorSpec(SOURCE, TARGET, uri, uri)
    sessions = Sessions(spark)
    mirror(sessions, spec, RunOptions(checkpoint=tmp_path / "ck", in_process_bytes=0))
    fill(store, SOURCE, 10, first=10)
    store.truncate(store.tail(SOURCE))
    fill(store, SOURCE, 10, first=20)
    small = RunOptions(checkpoint=tmp_path / "ck", in_process_bytes=1 << 20)
    with pytest.raises(JobFailed) as failed:
        mirror(sessions, spec, small)
    assert sessions.calls == 1  # batch 0 only
    message = str(failed.value)
    assert message.startswith(f"mirror job failed: stream {SOURCE} segment 0 was truncated")
    assert "\n" not in message
    assert f"--from {store.head(SOURCE).text}" in message
    assert seqs(store, TARGET) == list(range(10))


@pytest.mark.spark
def test_the_failure_says_how_to_go_on_without_copying_anything_twice(
    spark, store, store_dir, tmp_path
):
    """Segment 1 is truncated behind the checkpoint, segment 0 past it: `--from head` would
    copy segment 1's events between the head and the checkpoint again. The message names the
    cut that goes on exactly: the checkpoint's position, moved up to the head."""
    uri = f"embedded:{store_dir}"
    store.create_stream(SOURCE, segments=2)
    fill(store, SOURCE, 20)
    early = store.tail(SOURCE)
    fill(store, SOURCE, 20, first=20)
    spec = MirrorSpec(SOURCE, TARGET, uri, uri)
    run = RunOptions(checkpoint=tmp_path / "ck")
    assert mirror(spark, spec, run).events == 40
    fill(store, SOURCE, 20, first=40)
    tail = store.tail(SOURCE)
    store.truncate(StreamCut.of("edge", "scaled", {0: tail.offset(0), 1: early.offset(1)}))
    fill(store, SOURCE, 20, first=60)
    with pytest.raises(JobFailed) as failed:
        mirror(spark, spec, run)
    message = str(failed.value)
    assert "\n" not in message
    assert "events it had yet to read before that offset were dropped" in message
    assert "(--from applies to a new checkpoint only)" in message
    resume = re.search(r"--from (\S+)$", message)
    assert resume is not None, message
    cut = resume.group(1)
    assert cut != store.head(SOURCE).text
    fresh = RunOptions(checkpoint=tmp_path / "new", starting=cut)
    mirror(spark, spec, fresh)
    copied, remaining = seqs(store, TARGET), seqs(store, SOURCE)
    assert copied == sorted({*range(40), *(s for s in remaining if s >= 40)})  # each once


def slice_across_a_split(store) -> SliceRecord:
    """NIC events of edge1: three in segment 0, then (the slice starts here) a split, three
    into a successor, three more (the slice ends here); then the stream is truncated after the
    first three in the successor. Returns the recorded slice."""
    store.create_stream(STREAM, segments=1)
    times = iter(T0 + k * SECOND for k in range(9))

    def write(count: int) -> None:
        for _ in range(count):
            t0 = next(times)
            write_event(store, "edge1", nic_payload("edge1", t0, 0, [100] * 10), (t0, t0 + 9 * MS))

    write(3)
    start = store.tail(STREAM)
    store.split_segment(STREAM, 0)
    write(3)
    middle = store.tail(STREAM)
    write(3)
    made = SliceRecord.create(
        stream=STREAM,
        sensor="edge1",
        start_cut=start,
        end_cut=store.tail(STREAM),
        start_time_ns=T0,
        end_time_ns=T0 + 9 * SECOND,
        reason="test",
        created_by="test",
    )
    record_slices(store, [made])
    store.truncate(middle)
    return made


@pytest.mark.spark
def test_a_replay_of_a_slice_whose_successor_segments_were_truncated_is_refused(spark, store):
    made = slice_across_a_split(store)
    segment = next(seg for seg, head in store.head(STREAM).positions if seg > 0 and head > 0)
    expected = f"slice {made.slice_id} cannot be replayed: {STREAM} segment {segment} was"
    model = load_model("pipeline.models.nic:throughput")
    with pytest.raises(SliceTruncated, match=re.escape(expected)):
        replay(
            spark,
            store,
            made.slice_id,
            model,
            plan=flatten_plan("NetworkSamples"),
            home=sluice_home(),
        )
    assert not (sluice_home() / "replays").exists()


def test_sluice_replay_refuses_a_truncated_slice_before_starting_spark(
    store, store_dir, monkeypatch, capsys
):
    import pipeline.spark.session

    made = slice_across_a_split(store)
    started = []
    monkeypatch.setattr(pipeline.spark.session, "spark_session", lambda *a: started.append(a))
    argv = ["--store", f"embedded:{store_dir}", "replay", made.slice_id]
    model = ["--model", "pipeline.models.nic:throughput", "--schema", "NetworkSamples"]
    assert cli.main([*argv, *model]) == 1
    assert started == []
    err = capsys.readouterr().err
    assert f"slice {made.slice_id} cannot be replayed" in err
