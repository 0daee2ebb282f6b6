"""A job run again on its checkpoint with other parameters: the new ones apply cleanly, or the
run is refused before Spark starts, naming what changed; never a silent mix."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.jobs.bookmark import BookmarkSpec, Condition, bookmark
from pipeline.jobs.checkpoint import (
    Checkpoint,
    CheckpointMismatch,
    JobIdentity,
    JobParameters,
    ParametersChanged,
)
from pipeline.jobs.mirror import MirrorSpec, mirror
from pipeline.jobs.runner import RunOptions
from tests.jobs.test_bookmark import BURST, CALM
from tests.jobs.test_replay_support import STREAM, nic_stream
from tests.spark.conftest import fill

T0 = 1_609_362_000_000_000_000
#: why each job refuses, as its message says
KEY_CHANGED = (
    "the events it copied already carry those routing keys, and later ones would carry others "
    "in the same target stream"
)
EXPORT_CHANGED = (
    "a format added would hold only the rows from here on, one dropped would stay behind as "
    "it is, and rows partitioned by another time field would sit beside those already there"
)
BOOKMARK_CHANGED = (
    "its state holds runs opened under those, which would close as slices of the new ones, "
    "and its slices so far used them"
)
KEY_REMEDY = "give a new --checkpoint and a new --to stream to copy with the new ones"
EXPORT_REMEDY = "export to a new --output with a new --checkpoint to use the new ones"
BOOKMARK_REMEDY = (
    "give a new --checkpoint to use the new ones (with --from head it slices the whole stream "
    "again, beside the slices already recorded)"
)


def no_spark() -> None:
    pytest.fail("Spark was started for a run that is refused")


REMEDY = {"mirror": KEY_REMEDY, "export": EXPORT_REMEDY, "bookmark": BOOKMARK_REMEDY}


def refusal(root: Path, job: str, was: tuple[str, ...], now: tuple[str, ...], why: str) -> str:
    """The whole message of a refusal, as the job gives it."""
    return str(ParametersChanged(root.absolute(), job, was, now, why=why, remedy=REMEDY[job]))


# --- parameters recorded beside the checkpoint -----------------------------------------------


def test_parameters_of_a_checkpoint_without_output_may_change(tmp_path):
    identity = JobIdentity("export", "embedded:/s#edge/n", "/out")
    first = JobParameters("export", ("--format parquet", "--time-field TimestampNanos"))
    second = JobParameters("export", ("--format csv", "--time-field TimestampNanos"))
    with Checkpoint(tmp_path / "ck", identity) as checkpoint:
        checkpoint.check_parameters(first, has_output=False, why="w", remedy="r")
        checkpoint.check_parameters(
            second, has_output=False, why="w", remedy="r"
        )  # a failed first run
        checkpoint.check_parameters(second, has_output=True, why="w", remedy="r")
        message = (
            f"export checkpoint {tmp_path / 'ck'} was made with --format csv, not --format "
            "parquet: w. Run again with --format csv --time-field TimestampNanos, or r"
        )
        with pytest.raises(ParametersChanged, match=re.escape(message)):
            checkpoint.check_parameters(first, has_output=True, why="w", remedy="r")
    assert JobParameters.read(tmp_path / "ck") == second


def test_a_refusal_says_what_was_added_or_dropped(tmp_path):
    key = ("--fixed-routing-key site-1",)
    assert refusal(tmp_path, "mirror", key, (), "w").startswith(
        f"mirror checkpoint {tmp_path} was made with --fixed-routing-key site-1, which this run "
        "lacks: w. Run again with --fixed-routing-key site-1, or"
    )
    assert refusal(tmp_path, "mirror", (), key, "w").startswith(
        f"mirror checkpoint {tmp_path} was made without --fixed-routing-key site-1: w. Run "
        "again with none of them, or"
    )


# --- real runs -------------------------------------------------------------------------------


def run_cli(capsys, *argv: str) -> dict:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def fails(capsys, *argv: str) -> str:
    assert cli.main(list(argv)) == 1
    return capsys.readouterr().err


@pytest.mark.spark
def test_mirror_refuses_another_fixed_routing_key_on_its_checkpoint(
    spark, store, store_dir, tmp_path, caplog
):
    store.create_stream("edge/network", segments=2)
    fill(store, "edge/network", 30, keys=3)
    uri, ck = f"embedded:{store_dir}", tmp_path / "ck"
    spec = MirrorSpec("edge/network", "cloud/network", uri, uri, fixed_routing_key="site-1")
    assert mirror(spark, spec, RunOptions(checkpoint=ck)).events == 30
    moved = MirrorSpec("edge/network", "cloud/network", uri, uri, fixed_routing_key="site-2")
    site1, site2 = ("--fixed-routing-key site-1",), ("--fixed-routing-key site-2",)
    message = refusal(ck, "mirror", site1, site2, KEY_CHANGED)
    with pytest.raises(ParametersChanged, match=re.escape(message)):
        mirror(no_spark, moved, RunOptions(checkpoint=ck))
    unkeyed = MirrorSpec("edge/network", "cloud/network", uri, uri)
    message = refusal(ck, "mirror", site1, (), KEY_CHANGED)
    with pytest.raises(ParametersChanged, match=re.escape(message)):
        mirror(no_spark, unkeyed, RunOptions(checkpoint=ck))
    assert {e.routing_key for e in store.read("cloud/network")} == {"site-1"}
    # another target on the same checkpoint: refused by its identity
    other = MirrorSpec("edge/network", "cloud/other", uri, uri, fixed_routing_key="site-1")
    with pytest.raises(CheckpointMismatch):
        mirror(no_spark, other, RunOptions(checkpoint=ck))
    # how it commits may change; a --from on a checkpoint that has begun is said to be ignored
    driver = MirrorSpec("edge/network", "cloud/network", uri, uri, "site-1", commit_mode="driver")
    with caplog.at_level(logging.WARNING, logger="pipeline.jobs.checkpoint"):
        summary = mirror(no_spark, driver, RunOptions(checkpoint=ck, starting="tail"))
    assert summary.events == 0
    said = f"mirror: --from tail ignored: checkpoint {ck} goes on from where it stopped"
    assert said in caplog.text


@pytest.mark.spark
def test_export_refuses_other_formats_or_time_field_and_takes_another_file_size(
    spark, store, store_dir, tmp_path, capsys
):
    schema = {
        "type": "record",
        "name": "T",
        "fields": [
            {"name": "site", "type": "string"},
            {"name": "TimestampNanos", "type": {"type": "array", "items": "long"}},
            {"name": "ArrivalTimeNanos", "type": {"type": "array", "items": "long"}},
        ],
    }
    avsc = tmp_path / "t.avsc"
    avsc.write_text(json.dumps(schema))
    store.create_stream("edge/t", segments=1)

    def write(first: int) -> None:
        with store.writer("edge/t") as writer:
            for i in range(first, first + 3):
                times = [T0 + i * 10**9 + k for k in range(4)]
                event = {"site": "s", "TimestampNanos": times, "ArrivalTimeNanos": times}
                writer.write(json.dumps(event).encode(), routing_key="a")

    out, ck = tmp_path / "out", tmp_path / "ck"
    base = ["--store", f"embedded:{store_dir}", "run", "export", "--stream", "edge/t"]
    base += ["--schema", str(avsc), "--output", str(out), "--checkpoint", str(ck)]
    write(0)
    assert run_cli(capsys, *base, "--format", "parquet")["rows"] == 12
    write(3)
    made = ("--format parquet", "--time-field TimestampNanos")
    added = ("--format csv,parquet", "--time-field TimestampNanos")
    assert refusal(ck, "export", made, added, EXPORT_CHANGED) in fails(
        capsys, *base, "--format", "parquet,csv"
    )
    swapped = ("--format jsonl", "--time-field TimestampNanos")
    assert refusal(ck, "export", made, swapped, EXPORT_CHANGED) in fails(
        capsys, *base, "--format", "jsonl"
    )
    moved = refusal(
        ck, "export", made, ("--format parquet", "--time-field ArrivalTimeNanos"), EXPORT_CHANGED
    )
    time_field = ["--format", "parquet", "--time-field", "ArrivalTimeNanos"]
    assert moved in fails(capsys, *base, *time_field)
    assert not (out / "csv").exists()
    # the same parameters, given differently, and another file size: it goes on
    same = ["--format", "parquet", "--time-field", "TimestampNanos", "--max-rows-per-file", "5"]
    again = run_cli(capsys, *base, *same)
    assert (again["events"], again["rows"]) == (3, 12)


@pytest.mark.spark
def test_bookmark_refuses_other_conditions_sensors_or_minimum_on_its_state(
    spark, store, store_dir, tmp_path
):
    nic_stream(store, {"edge1": [CALM, BURST, BURST, CALM], "edge2": [CALM, CALM, BURST]})
    uri, ck = f"embedded:{store_dir}", tmp_path / "ck"
    burst = (Condition("burst", value=100.0),)
    spec = BookmarkSpec(STREAM, "NetworkSamples", uri, burst)
    first = bookmark(spark, spec, RunOptions(checkpoint=ck))
    assert first.events == 7
    made = ("--sensor-by routing_key", "--burst-mbps 100", "--min-samples 1")
    changes = [
        (BookmarkSpec(STREAM, "NetworkSamples", uri, (Condition("burst", value=50.0),)),
         ("--sensor-by routing_key", "--burst-mbps 50", "--min-samples 1")),
        (BookmarkSpec(STREAM, "NetworkSamples", uri, (*burst, Condition("above", "RxBytes", 9))),
         ("--sensor-by routing_key", "--above RxBytes=9", "--burst-mbps 100", "--min-samples 1")),
        (BookmarkSpec(STREAM, "NetworkSamples", uri, burst, sensor_by="RemoteAddr"),
         ("--sensor-by RemoteAddr", "--burst-mbps 100", "--min-samples 1")),
        (BookmarkSpec(STREAM, "NetworkSamples", uri, burst, min_samples=5),
         ("--sensor-by routing_key", "--burst-mbps 100", "--min-samples 5")),
    ]  # fmt: skip
    for changed, wanted in changes:
        message = refusal(ck, "bookmark", made, wanted, BOOKMARK_CHANGED)
        with pytest.raises(ParametersChanged, match=re.escape(message)):
            bookmark(no_spark, changed, RunOptions(checkpoint=ck))
    # who signs the slices may change: nothing new, nothing started
    signed = BookmarkSpec(STREAM, "NetworkSamples", uri, burst, name="tuned")
    assert bookmark(no_spark, signed, RunOptions(checkpoint=ck)).events == 0
