"""`sluice run mirror`: exactly-once copies, another store, fixed keys, one run per checkpoint."""

from __future__ import annotations

import json
import re

import pytest

from pipeline import cli
from pipeline.jobs.checkpoint import Checkpoint, CheckpointInUse, CheckpointMismatch, JobIdentity
from pipeline.jobs.mirror import MirrorSpec, TargetTaken, mirror
from pipeline.jobs.runner import RunOptions
from pipeline.streams import open_store
from tests.spark.conftest import fill, per_key_sequences

from .conftest import cut_short_write

pytestmark = pytest.mark.spark


@pytest.fixture
def edge(store):
    store.create_stream("edge/network", segments=2)
    return store


def run_cli(capsys, *argv: str) -> dict:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_mirror_into_another_store_with_a_fixed_routing_key(
    spark, edge, store_dir, tmp_path, capsys
):
    written = fill(edge, "edge/network", 300, keys=4)
    cloud = f"embedded:{tmp_path / 'cloud'}"
    summary = run_cli(
        capsys,
        "--store", f"embedded:{store_dir}",
        "run", "mirror", "--stream", "edge/network", "--to", "site-1/network",
        "--to-store", cloud, "--fixed-routing-key", "site-1", "--max-events", "80",
    )  # fmt: skip
    assert summary["events"] == 300 and summary["batches"] >= 4
    assert summary["lag_bytes"] == 0
    assert summary["end_cut"] == edge.tail("edge/network").text
    with open_store(cloud) as target:
        copied = list(target.read("site-1/network"))
    assert {e.routing_key for e in copied} == {"site-1"}
    assert per_key_sequences([e.payload for e in copied]) == per_key_sequences(
        [w.payload for w in written]
    )
    reports = summary["reports"]
    assert reports[0]["start_cut"] == edge.head("edge/network").text
    assert all(r["rows"] == r["events"] for r in reports)
    assert reports[1]["start_cut"] == reports[0]["end_cut"]


def test_a_second_run_continues_where_the_first_stopped(spark, edge, store_dir):
    uri = f"embedded:{store_dir}"
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri)
    fill(edge, "edge/network", 120)
    first = mirror(spark, spec, RunOptions(max_events=50))
    fill(edge, "edge/network", 80, first=120)
    second = mirror(spark, spec, RunOptions())
    assert (first.events, second.events) == (120, 80)
    assert second.start_cut == first.end_cut
    copied = [e.payload for e in edge.read("cloud/network")]
    assert sorted(copied) == sorted(e.payload for e in edge.read("edge/network"))


def test_a_run_killed_while_spark_wrote_its_first_offset_is_run_again(
    spark, edge, store_dir, tmp_path
):
    # The mirror's kill suite found it: killed in that write, every later run failed with
    # STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY (Spark saw a new query, and a file in offsets/).
    uri = f"embedded:{store_dir}"
    fill(edge, "edge/network", 60)
    cut_short_write(tmp_path / "ck" / "spark" / "offsets", 0)
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri)
    assert mirror(spark, spec, RunOptions(checkpoint=tmp_path / "ck")).events == 60
    copied = sorted(e.payload for e in edge.read("cloud/network"))
    assert copied == sorted(e.payload for e in edge.read("edge/network"))


def test_from_tail_skips_history_on_a_new_checkpoint(spark, edge, store_dir):
    uri = f"embedded:{store_dir}"
    fill(edge, "edge/network", 50)
    summary = mirror(
        spark, MirrorSpec("edge/network", "cloud/x", uri, uri), RunOptions(starting="tail")
    )
    assert summary.events == 0
    assert list(edge.read("cloud/x")) == []


def test_a_new_checkpoint_into_a_target_that_holds_events_is_refused(
    spark, edge, store_dir, tmp_path
):
    # a second checkpoint (or one made again after the first was lost) copied every event again
    uri = f"embedded:{store_dir}"
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri)
    fill(edge, "edge/network", 30)
    assert mirror(spark, spec, RunOptions(checkpoint=tmp_path / "a")).events == 30
    fill(edge, "edge/network", 5, first=30)
    with pytest.raises(TargetTaken, match="cloud/network holds 30 events already") as refused:
        mirror(spark, spec, RunOptions(checkpoint=tmp_path / "b"))
    assert "--from tail" in str(refused.value)
    assert edge.info("cloud/network").events == 30
    # started after what the target holds, it goes on; the first checkpoint goes on too
    assert mirror(spark, spec, RunOptions(checkpoint=tmp_path / "b", starting="tail")).events == 0
    assert mirror(spark, spec, RunOptions(checkpoint=tmp_path / "a")).events == 5
    assert edge.info("cloud/network").events == 35


def test_a_second_run_on_a_checkpoint_in_use_is_refused(spark, edge, store_dir, tmp_path):
    uri = f"embedded:{store_dir}"
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri)
    identity = JobIdentity("mirror", f"{uri}#edge/network", f"{uri}#cloud/network")
    with Checkpoint(tmp_path / "ck", identity):
        with pytest.raises(CheckpointInUse, match=re.escape("pid ")):
            mirror(spark, spec, RunOptions(checkpoint=tmp_path / "ck"))


def test_a_checkpoint_of_another_job_is_refused(spark, edge, store_dir, tmp_path):
    uri = f"embedded:{store_dir}"
    fill(edge, "edge/network", 10)
    mirror(
        spark, MirrorSpec("edge/network", "a/b", uri, uri), RunOptions(checkpoint=tmp_path / "ck")
    )
    with pytest.raises(CheckpointMismatch, match=re.escape("belongs to `mirror")):
        mirror(
            spark,
            MirrorSpec("edge/network", "a/c", uri, uri),
            RunOptions(checkpoint=tmp_path / "ck"),
        )


def test_an_unknown_stream_is_one_clear_line(store, store_dir, capsys):
    code = cli.main(
        ["--store", f"embedded:{store_dir}", "run", "mirror", "--stream", "no/such", "--to", "a/b"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("sluice: error: stream no/such does not exist")


@pytest.mark.parametrize("job", ["mirror", "console"])
def test_a_store_that_does_not_exist_is_one_clear_line_and_stays_so(tmp_path, capsys, job):
    missing = tmp_path / "no-such-store"
    extra = ["--to", "c/d"] if job == "mirror" else []
    code = cli.main(["--store", f"embedded:{missing}", "run", job, "--stream", "a/b", *extra])
    err = capsys.readouterr().err
    assert code == 1
    assert f"no store at {missing}: nothing was ever written there (check --store)" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not missing.exists()
    assert len(err.strip().splitlines()) == 1


def test_a_stream_mirrored_into_itself_is_refused_before_spark_starts(store, store_dir, capsys):
    """The same stream in the same store, however the store is named: every run would copy
    the copies again (a continuous one for ever)."""
    store.create_stream("a/s")
    with store.writer("a/s") as writer:
        writer.write(b"x")
    link = store_dir.parent / "link"
    link.symlink_to(store_dir)
    for to_store in (
        f"embedded:{store_dir}/",
        f"embedded:{link}",
        f"embedded:{store_dir}/../{store_dir.name}",
    ):
        argv = ["--store", f"embedded:{store_dir}", "run", "mirror", "--stream", "a/s"]
        code = cli.main([*argv, "--to", "a/s", "--to-store", to_store, "--available-now"])
        err = capsys.readouterr().err
        assert code == 1, err
        assert "a stream cannot be mirrored into itself" in err and len(err.splitlines()) == 1
    assert [e.payload for e in store.read("a/s")] == [b"x"]
    MirrorSpec("a/s", "a/t", f"embedded:{store_dir}", f"embedded:{store_dir}")  # another stream
    MirrorSpec("a/s", "a/s", f"embedded:{store_dir}", f"embedded:{link}-not")  # another store


def test_bad_trigger_is_refused(store_dir, capsys):
    code = cli.main(
        ["--store", f"embedded:{store_dir}", "run", "mirror", "--stream", "a/b", "--to", "c/d",
         "--continuous", "--trigger", "soon"]
    )  # fmt: skip
    assert code == 1
    assert "--trigger 'soon'" in capsys.readouterr().err


def test_a_truncated_source_fails_the_job_with_the_stores_message(spark, edge, store_dir, tmp_path):
    from pipeline.jobs.runner import JobFailed

    uri = f"embedded:{store_dir}"
    fill(edge, "edge/network", 40)
    start = edge.head("edge/network")
    fill(edge, "edge/network", 40, first=40)
    edge.truncate(edge.tail("edge/network"))
    spec = MirrorSpec("edge/network", "cloud/t", uri, uri)
    with pytest.raises(JobFailed, match="was truncated at offset"):
        mirror(spark, spec, RunOptions(starting=start.text, checkpoint=tmp_path / "ck"))


@pytest.mark.parametrize("job", ["mirror", "console"])
def test_a_from_cut_of_another_stream_id_is_refused_before_spark_and_leaves_no_checkpoint(
    store, store_dir, tmp_path, capsys, job
):
    """A `--from` cut whose stream id is not the stream's was refused inside Spark, after the
    run had recorded it as the checkpoint's start: every later run failed on it, `--from head`
    too. It is one line before Spark starts, and nothing is recorded."""
    store.create_stream("a/b")
    with store.writer("a/b") as writer:
        writer.write(b"x")
    checkpoint = tmp_path / "checkpoint"
    extra = ["--to", "c/d"] if job == "mirror" else []
    argv = ["--store", f"embedded:{store_dir}", "run", job, "--stream", "a/b", *extra]
    code = cli.main([*argv, "--from", "v2~a~b~99~0-0", "--checkpoint", str(checkpoint)])
    err = capsys.readouterr().err
    assert code == 1
    assert f"{job} job failed: sluice option startingCut ('v2~a~b~99~0-0')" in err
    assert "it is a cut of another stream (stream id 99), not of a/b" in err
    assert sum(line.startswith("sluice: error:") for line in err.splitlines()) == 1, err
    assert "Traceback" not in err and "ERROR" not in err  # (Spark's log) never started
    assert not (checkpoint / "start_cut").exists()
