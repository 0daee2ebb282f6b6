"""`sluice run join` at its edges: a checkpoint run again with other join parameters, a max
gap too large for the time column's unit, and the spec of its kill-test failpoints."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.failpoints import BadFailpoints, Failpoints
from pipeline.jobs.stream_join import (
    FAILPOINTS,
    FAILPOINTS_ENV,
    JoinParametersChanged,
    SeriesSource,
    process_batch,
)
from tests.jobs.test_bookmark import events_table
from tests.jobs.test_stream_join import (
    PLAN,
    STREAM,
    expected_final,
    join_argv,
    parts,
    spec_for,
    two_series,
)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"max_gap_seconds": 0.0001}, "max gap none, not schema NetworkSamples, time column "),
        ({"time_column": "RxBytes"}, "time column 'TimestampNanos', max gap none, not "),
    ],
    ids=["max-gap", "time-column"],
)
def test_a_batch_with_other_parameters_on_a_join_state_is_refused(
    store, store_dir, tmp_path, change, said
):
    two_series(store)
    spec = spec_for(store_dir, tmp_path / "out")
    events = events_table(store)
    process_batch(spec, PLAN, tmp_path / "cp" / "join", 0, events.slice(0, 6))
    written = sorted(p.name for p in spec.output.glob("part-*"))
    other = dataclasses.replace(spec, **change)
    with pytest.raises(JoinParametersChanged, match=re.escape(said)):
        process_batch(other, PLAN, tmp_path / "cp" / "join", 1, events.slice(6))
    assert sorted(p.name for p in spec.output.glob("part-*")) == written
    # The same parameters go on where the state stopped.
    process_batch(spec, PLAN, tmp_path / "cp" / "join", 1, events.slice(6))
    assert parts(spec.output).equals(expected_final(store, spec))


def test_a_join_state_from_before_parameters_were_recorded_is_checked_too(
    store, store_dir, tmp_path
):
    two_series(store)
    spec = spec_for(store_dir, tmp_path / "out")
    events = events_table(store)
    process_batch(spec, PLAN, tmp_path / "cp" / "join", 0, events.slice(0, 6))
    (tmp_path / "cp" / "join" / "parameters.json").unlink()
    other = dataclasses.replace(spec, max_gap_seconds=0.5)
    with pytest.raises(JoinParametersChanged, match=re.escape("max gap None, not time column")):
        process_batch(other, PLAN, tmp_path / "cp" / "join", 1, events.slice(6))


def test_a_huge_max_gap_joins_everything_nearest(store, store_dir, tmp_path):
    """1e300 s is a finite gap (accepted up front); in nanoseconds it must not overflow to an
    infinite one that the joiner refuses in the middle of a batch."""
    two_series(store)
    spec = dataclasses.replace(spec_for(store_dir, tmp_path / "out"), max_gap_seconds=1e300)
    process_batch(spec, PLAN, tmp_path / "state", 0, events_table(store))
    assert parts(spec.output).equals(expected_final(store, spec))


@pytest.mark.spark
def test_sluice_run_join_refuses_other_parameters_on_its_checkpoint(
    spark, store, store_dir, tmp_path, capsys
):
    two_series(store)
    out = tmp_path / "joined"
    argv = join_argv(store_dir, out, 6)
    assert cli.main(argv) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.glob("part-*")}
    assert cli.main([*argv, "--max-gap", "0.001"]) == 1
    err = capsys.readouterr().err
    assert (
        "max gap none, not schema NetworkSamples, time column 'TimestampNanos', max gap 0.001"
        in (err)
    )
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.glob("part-*")} == before


@pytest.mark.spark
def test_a_new_checkpoint_into_a_join_output_that_holds_pairs_is_refused(
    spark, store, store_dir, tmp_path, capsys
):
    """Another checkpoint, into the output as given, through `..` (its first part not made
    yet) or a symbolic link, and the default one made again once the home is lost: each would
    write part-0, part-1... again, pairs replaced, or counted twice beside the earlier run's
    later parts (measured, through `..`: 146 pairs became 250)."""
    two_series(store)
    out = tmp_path / "joined"
    argv = join_argv(store_dir, out, 4)
    assert cli.main(argv) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.glob("part-*")}
    assert len(before) > 1
    (tmp_path / "link").symlink_to(out)
    at = argv.index("--output") + 1
    for n, spelled in enumerate([out, tmp_path / "not-yet" / ".." / "joined", tmp_path / "link"]):
        other = ["--max-events", "12", "--checkpoint", str(tmp_path / f"checkpoint-{n}")]
        assert cli.main([*argv[:at], str(spelled), *argv[at + 1 : -2], *other]) == 1
        err = capsys.readouterr().err
        assert f"join output {spelled} holds pairs another checkpoint wrote" in err, err
        assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in out.glob("part-*")} == before
    assert cli.main(argv) == 0  # its own checkpoint goes on
    assert parts(out).equals(expected_final(store, spec_for(store_dir, out)))
    capsys.readouterr()
    shutil.rmtree(sluice_home() / "checkpoints")
    assert cli.main(argv) == 1
    assert f"join output {out} holds pairs another checkpoint wrote" in capsys.readouterr().err
    assert parts(out).equals(expected_final(store, spec_for(store_dir, out)))


def test_checkpoints_name_every_series_apart_and_as_they_always_have():
    texts = {SeriesSource("s", key).checkpoint_text for key in (None, "None", "\0None", "\0", "")}
    assert len(texts) == 5
    assert SeriesSource("s").checkpoint_text == "s#None"  # the name checkpoints already have
    assert SeriesSource("s", "edge1").checkpoint_text == "s#edge1"


def test_failpoints_name_the_join_s_points_and_their_hit(monkeypatch):
    monkeypatch.setenv(FAILPOINTS_ENV, " join.in_part:2, join.after_state ")
    points = Failpoints.from_environment(FAILPOINTS_ENV, known=FAILPOINTS)
    assert points.remaining == {"join.in_part": 2, "join.after_state": 1}
    monkeypatch.delenv(FAILPOINTS_ENV)
    assert not Failpoints.from_environment(FAILPOINTS_ENV, known=FAILPOINTS).armed
    points = Failpoints("join.after_part:3", known=FAILPOINTS)
    points.hit("join.after_part")  # the 3rd hit kills, not this one
    assert points.remaining == {"join.after_part": 2}


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("join.nowhere", "names no point of join.in_part, join.after_part, join.after_state"),
        ("join.in_part:0", "needs a hit count of 1 or more"),
        ("join.in_part:x", "needs a hit count of 1 or more"),
    ],
)
def test_a_failpoint_spec_that_names_no_point_is_refused(spec, reason):
    said = f"{FAILPOINTS_ENV}: failpoint {spec!r} {reason}; use NAME or NAME:HIT"
    with pytest.raises(BadFailpoints, match=re.escape(said)):
        Failpoints(spec, variable=FAILPOINTS_ENV, known=FAILPOINTS)


def test_rows_that_wait_for_a_silent_series_are_reported_as_they_grow(
    store, store_dir, tmp_path, monkeypatch, caplog
):
    """One side's sensor stopped writing: the other side's rows wait for it, in memory and
    in each batch's state. The job says so when they pass a bound, and at each doubling."""
    from pipeline.jobs import stream_join

    monkeypatch.setattr(stream_join, "WAITING_ROWS", 20)
    two_series(store)
    spec = spec_for(store_dir, tmp_path / "out")
    silent = dataclasses.replace(spec, right=dataclasses.replace(spec.right, routing_key="gone"))
    events = events_table(store)
    with caplog.at_level("WARNING", logger="pipeline.jobs.stream_join"):
        for batch, first in enumerate(range(0, 12, 2)):
            process_batch(silent, PLAN, tmp_path / "cp" / "join", batch, events.slice(first, 2))
    said = [r.getMessage() for r in caplog.records]
    # edge1's 10 rows an event, 6 events: 20 rows (reported), 40 (reported), 60 (not yet 80)
    assert said == [
        f"join: {n} left rows wait for the right series {STREAM}#gone (no record of it yet): a "
        "pair is final only once both series have passed its time; check that its sensor "
        "still writes"
        for n in (20, 40)
    ]
