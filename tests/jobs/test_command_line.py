"""Each job spec's command line, parsed by the real `sluice run` parser, gives the spec back.

This is what lets Dagster print a service command (`assets/catch_up.py`, `assets/slices.py`)
that runs exactly the spec its assets run, on the same checkpoint. No Spark is started; what a
batch would refuse is refused before Spark starts, in the words it would have used.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import cli
from pipeline.cli import build_parser
from pipeline.cli import run as run_command
from pipeline.cli.run import job_spec, run_options
from pipeline.jobs.bookmark import BookmarkError, BookmarkSpec, Condition
from pipeline.jobs.console import ConsoleSpec
from pipeline.jobs.export import ExportSpec
from pipeline.jobs.mirror import MirrorSpec
from pipeline.jobs.runner import SERVICE, RunOptions
from pipeline.jobs.stream_join import SeriesSource, StreamJoinSpec

EDGE, CLOUD = "embedded:/srv/edge", "pravega://cloud:9090"
OUT = Path("/srv/out")

SPECS = {
    "mirror": MirrorSpec("edge/network", "site-1/network", EDGE, CLOUD),
    "mirror, every option": MirrorSpec(
        "edge/network", "site-1/network", EDGE, EDGE, "site 1", commit_mode="driver"
    ),
    "export": ExportSpec("cloud/network", "NetworkSamples", OUT, CLOUD),
    "export, every option": ExportSpec(
        "cloud/network",
        "/schemas/My Samples.avsc",
        OUT,
        CLOUD,
        formats=("jsonl", "parquet"),
        max_rows_per_file=5_000,
        time_field="TimestampNanos",
    ),
    "console": ConsoleSpec("edge/network", EDGE),
    "console, every option": ConsoleSpec("edge/network", EDGE, max_chars=1000),
    "bookmark": BookmarkSpec(
        "cloud/network", "NetworkSamples", CLOUD, (Condition("burst", value=50.0),)
    ),
    "bookmark, every option": BookmarkSpec(
        "cloud/network",
        "NetworkSamples",
        CLOUD,
        (
            Condition("predicate", predicate="tests.jobs.test_bookmark:early_rx"),
            Condition("above", field="RxBytes", value=1e12),
            Condition("burst", value=12.5),
            Condition("below", field="value", value=-0.1),
            Condition("below", field="TxBytes", value=3.0),
        ),
        sensor_by="RemoteAddr,Interface",
        slices_stream="cloud/my-slices",
        name="bookmark network",
    ),
    "join": StreamJoinSpec(
        SeriesSource("examples/machine", "r"), SeriesSource("examples/machine", "s"),
        "NetworkSamples", EDGE, OUT,
    ),
    "join, every option": StreamJoinSpec(
        SeriesSource("examples/left"), SeriesSource("examples/right", "key #2"),
        "NetworkSamples", EDGE, OUT / "pairs", time_column="time", max_gap_seconds=0.25,
    ),
}  # fmt: skip

RUNS = {
    "service": SERVICE,
    "defaults": RunOptions(),
    "every option": RunOptions(
        mode="continuous",
        trigger_seconds=0.5,
        starting="tail",
        max_events=1000,
        max_bytes=1 << 20,
        checkpoint=Path("/srv/checkpoints/a b"),
        in_process_bytes=0,
    ),
}


def parse(argv: list[str]):
    assert argv[0] == "sluice"
    args = build_parser("run").parse_args(argv[1:])
    return job_spec(args), run_options(args)


@pytest.mark.parametrize("name", SPECS)
def test_a_spec_survives_its_command_line(name):
    spec = SPECS[name]
    assert parse(spec.command_line()) == (spec, SERVICE)


@pytest.mark.parametrize("run", RUNS.values(), ids=RUNS)
def test_run_options_survive_the_command_line(run):
    assert parse(SPECS["mirror"].command_line(run)) == (SPECS["mirror"], run)


def test_a_service_command_names_the_store_first_and_runs_continuously():
    argv = SPECS["mirror"].command_line()
    assert argv[:5] == ["sluice", "--store", EDGE, "run", "mirror"]
    assert argv[-1] == "--continuous"


def test_a_relative_join_output_is_made_absolute_as_the_command_line_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = StreamJoinSpec(SeriesSource("a/b"), SeriesSource("a/c"), "S", EDGE, Path("out"))
    assert spec.output == tmp_path / "out"
    assert parse(spec.command_line())[0] == spec


def test_two_burst_conditions_have_no_command_line():
    twice = (Condition("burst", value=1.0), Condition("burst", value=2.0))
    spec = BookmarkSpec("cloud/network", "NetworkSamples", CLOUD, twice)
    with pytest.raises(BookmarkError, match="the command line takes one burst condition"):
        spec.command_line()


def test_a_batch_without_the_total_input_rows_counts_its_sources():
    """Spark Connect's progress JSON has `"numInputRows": null` at the top: the batch report
    sums the sources' (a bookmark run through the warm Spark failed on it)."""
    from pipeline.jobs.reports import _input_rows

    connect = {"numInputRows": None, "sources": [{"numInputRows": 40}, {"numInputRows": 2}]}
    assert _input_rows(connect) == 42
    assert _input_rows({"numInputRows": 7, "sources": [{"numInputRows": 40}]}) == 7


OTHER_CUT = "v1~edge~other~0-0"
#: `sluice run` argv (after `--store`) -> the one line it is refused with
REFUSED = {
    "mirror --from garbage": (
        ["mirror", "--stream", "edge/net", "--to", "cloud/net", "--from", "garbage"],
        "mirror job failed: sluice option startingCut ('garbage'): invalid stream cut "
        "'garbage': expected v2~SCOPE~STREAM~ID~SEGMENT-OFFSET... or"
        " v1~SCOPE~STREAM~SEGMENT-OFFSET... (or use head / tail)",
    ),
    "console --from another stream's cut": (
        ["console", "--stream", "edge/net", "--continuous", "--from", OTHER_CUT],
        f"console job failed: sluice option startingCut ({OTHER_CUT!r}): invalid stream cut "
        f"{OTHER_CUT!r}: it is a cut of stream edge/other, not of edge/net (or use head / tail)",
    ),
    "bookmark --above a column the rows lack": (
        ["bookmark", "--stream", "edge/net", "--schema", "NetworkSamples", "--above", "rx=1"],
        "bookmark job failed: bookmark --above: no column 'rx' in the rows",
    ),
    "bookmark --slices-stream no stream name": (
        ["bookmark", "--stream", "edge/net", "--schema", "NetworkSamples", "--above",
         "RxBytes=1", "--slices-stream", "my slices"],
        "bookmark job failed: invalid stream name 'my slices': expected SCOPE/STREAM (use "
        "1-255 ASCII letters, digits, '-', '_' or '.', not starting with '.' or '-')",
    ),
    "join --max-gap below zero": (
        ["join", "--left", "edge/net#a", "--right", "edge/net#b", "--schema", "NetworkSamples",
         "--output", "pairs", "--max-gap", "-1"],
        "join job failed: max gap -1.0: give a finite number of seconds, zero or more "
        "(--max-gap)",
    ),
    "join --time-column the schema lacks": (
        ["join", "--left", "edge/net#a", "--right", "edge/net#b", "--schema", "NetworkSamples",
         "--output", "pairs", "--time-column", "when"],
        "cannot join edge/net: schema NetworkSamples has no column 'when'",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", REFUSED)
def test_what_a_batch_would_refuse_is_refused_before_spark_starts(
    store, store_dir, monkeypatch, capsys, case
):
    """A bad `--from` (or condition, slices stream, max gap, time column) used to be found by
    the first batch, after Spark's start-up (about 10 s): now the job fails at once, with the
    same line, and never asks for a session."""
    argv, message = REFUSED[case]
    store.create_stream("edge/net", segments=2)

    def no_spark(task):
        msg = "Spark was started"
        raise AssertionError(msg)

    monkeypatch.setattr(run_command, "_session", no_spark)
    code = cli.main(["--store", f"embedded:{store_dir}", "run", *argv])
    said = capsys.readouterr().err.splitlines()  # the progress lines, then the error
    assert (code, said[-1]) == (1, f"sluice: error: {message}")


@pytest.mark.parametrize("chars", ["5", "0", "-1"])
def test_console_max_chars_below_its_least_is_refused_not_raised(chars, capsys):
    """`--max-chars` below 20 became 20 without a word; it is refused as a usage error."""
    with pytest.raises(SystemExit) as ended:
        cli.main(["run", "console", "--stream", "a/b", "--max-chars", chars])
    assert ended.value.code == 2
    assert "argument --max-chars" in capsys.readouterr().err
