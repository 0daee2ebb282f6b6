"""`sluice run <job> …`: the streaming jobs on the command line.

    sluice run mirror|export|console|bookmark|join  JOB FLAGS  [RUN FLAGS]

A job is a spec, a run function and `spec.command_line()` in its module under `pipeline/jobs/`;
here each job's flags become its spec (`job_spec(args)`), and parsing `spec.command_line()`
gives that spec back. The run flags every job shares (`common_options`): `--checkpoint`,
`--available-now` (default) or `--continuous [--trigger 10s]`, `--from head|tail|CUT` (first
start only), `--max-events N` / `--max-bytes N` per batch, `--in-process-bytes N` (a small
backlog runs without Spark). Progress (starting Spark, where
the job reads from, each batch) goes to stderr (`pipeline/cli/progress.py`); the summary is
JSON on stdout. SIGTERM or Ctrl-C stops a job after the batch in flight, a second one at once
(`pipeline/jobs/stopping.py`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.cli.options import slices_stream_option, whole_number
from pipeline.cli.progress import Progress, Task
from pipeline.config import under_home
from pipeline.errors import SluiceError, sigterm_interrupts
from pipeline.jobs.bookmark import (
    DEFAULT_NAME,
    BookmarkSpec,
    bookmark,
    check_conditions,
    conditions_of,
)
from pipeline.jobs.console import MAX_CHARS, MIN_CHARS, ConsoleSpec, console
from pipeline.jobs.export import DEFAULT_FORMATS, MAX_ROWS_PER_FILE, ExportSpec, export
from pipeline.jobs.in_process import IN_PROCESS_BYTES, IN_PROCESS_ENV
from pipeline.jobs.mirror import MirrorSpec, mirror
from pipeline.jobs.runner import BatchReport, JobSummary, RunOptions
from pipeline.jobs.stream_join import TIME_COLUMN, SeriesSource, StreamJoinSpec, join_streams
from pipeline.wording import counted

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TRIGGER_FLAG, FORMAT_FLAG, ROWS_FLAG = "--trigger", "--format", "--max-rows-per-file"
IN_PROCESS_FLAG = "--in-process-bytes"
STREAM_HELP = "SCOPE/STREAM"
OUTPUT_HELP = (
    "a relative path is under $SLUICE_HOME, as sluice.toml's [exports] dir is (so "
    "exports/network is where `sluice sql` looks); an absolute path is kept"
)


class UsageError(SluiceError, ValueError):
    def __init__(self, option: str, value: str, reason: str) -> None:
        self.option, self.value, self.reason = option, value, reason
        msg = f"{option} {value!r}: {reason}"
        super().__init__(msg)


def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser("run", help="run a streaming job (mirror, export, console, …)")
    jobs = run.add_subparsers(dest="job", required=True, metavar="JOB")
    common = common_options()
    for add_job in (_add_mirror, _add_export, _add_console, _add_bookmark, _add_join):
        add_job(jobs, common)


def common_options() -> argparse.ArgumentParser:
    """The flags every job shares (use as `parents=[common]`)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--checkpoint", type=Path, help="checkpoint directory (one per job)")
    mode = common.add_mutually_exclusive_group()
    mode.add_argument(
        "--available-now",
        dest="mode",
        action="store_const",
        const="available-now",
        help="process everything up to the tail as of now, then stop (default)",
    )
    mode.add_argument(
        "--continuous",
        dest="mode",
        action="store_const",
        const="continuous",
        help="run a batch every --trigger interval until stopped",
    )
    common.set_defaults(mode="available-now")
    common.add_argument("--trigger", default="10s", help="batch interval, e.g. 10s, 500ms, 1m")
    common.add_argument(
        "--from",
        dest="starting",
        default="head",
        metavar="head|tail|CUT",
        help="where a new checkpoint starts (default head)",
    )
    common.add_argument("--max-events", type=int, help="at most this many events per batch")
    common.add_argument("--max-bytes", type=int, help="at most this many payload bytes per batch")
    common.add_argument(
        IN_PROCESS_FLAG,
        type=int,
        metavar="N",
        help="mirror, export, bookmark, console until caught up: a backlog of at most N bytes "
        "runs as one batch in this process, without Spark; 0: always Spark (default "
        f"${IN_PROCESS_ENV}, else {IN_PROCESS_BYTES >> 20} MiB)",
    )
    return common


def parse_interval(text: str) -> float:
    """`10s`, `500ms`, `2m`, `1h` or plain seconds -> seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match:
        reason = "use a number with ms, s, m or h (e.g. 10s)"
        raise UsageError(TRIGGER_FLAG, text, reason)
    scale = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2) or "s"]
    seconds = float(match.group(1)) * scale
    if seconds <= 0:
        reason = "the interval must be above zero"
        raise UsageError(TRIGGER_FLAG, text, reason)
    return seconds


def run_options(args: argparse.Namespace) -> RunOptions:
    for flag, value in (("--max-events", args.max_events), ("--max-bytes", args.max_bytes)):
        if value is not None and value <= 0:
            reason = "expected a positive number"
            raise UsageError(flag, str(value), reason)
    if args.in_process_bytes is not None and args.in_process_bytes < 0:
        reason = "expected 0 (always Spark) or a positive number"
        raise UsageError(IN_PROCESS_FLAG, str(args.in_process_bytes), reason)
    return RunOptions(
        mode=args.mode,
        trigger_seconds=parse_interval(args.trigger),
        starting=args.starting,
        max_events=args.max_events,
        max_bytes=args.max_bytes,
        checkpoint=args.checkpoint,
        in_process_bytes=args.in_process_bytes,
    )


def job_spec(args: argparse.Namespace) -> Any:
    """The spec of the job `args` were parsed for (no I/O: nothing is opened or checked)."""
    return args.spec_of(args)


def store_uri(args: argparse.Namespace) -> str:
    from pipeline.config import default_store_uri

    return args.store or default_store_uri()


def check_stream(store: str, stream: str) -> None:
    """Fail fast (before Spark starts) when the stream, or its whole store, does not exist (a
    job reads its source: a misspelt --store leaves no new, empty store behind)."""
    from pipeline.streams import open_store

    with open_store(store, must_exist=True) as opened:
        opened.info(stream)


def print_summary(summary: JobSummary) -> int:
    document = {
        "job": summary.job,
        "checkpoint": summary.checkpoint,
        "batches": len(summary.batches),
        "events": summary.events,
        "rows": summary.rows,
        "quarantined": summary.quarantined,
        "start_cut": summary.start_cut,
        "end_cut": summary.end_cut,
        "lag_bytes": summary.lag_bytes,
        "outputs": summary.outputs,
        "reports": [asdict(b) for b in summary.batches],
    }
    print(json.dumps(document, indent=2))
    return 0


class BatchProgress:
    """A job's batches as progress: each one's report as a line, the events so far on a bar."""

    def __init__(self, task: Task) -> None:
        self.task, self.events, self.batches = task, 0, 0

    def __call__(self, report: BatchReport) -> None:
        self.events += report.events
        self.batches += 1
        self.task.note(report.line())
        lag = "?" if report.lag_bytes is None else counted(report.lag_bytes, "byte")
        self.task.status(
            f"{counted(self.events, 'event')} so far in "
            f"{counted(self.batches, 'batch', 'batches')}, lag {lag}"
        )


def _start(
    args: argparse.Namespace, job: Callable[..., JobSummary], spec: Any, run: RunOptions
) -> JobSummary:
    """Run `job` over `spec` in this process's Spark session, showing its progress (where it
    reads from, starting Spark, each batch) on standard error. The session starts only if the
    job needs it: a caught-up `--available-now` run does not.

    SIGTERM is Ctrl-C's twin: while the query runs, either stops it after the batch in flight
    (a second one at once) and the summary is printed; before that, either interrupts the run
    (`pipeline/jobs/stopping.py`)."""
    progress = Progress.of(args, data_on_stdout=job is console)
    with progress.task(args.job) as task, sigterm_interrupts():
        task.stage(f"reading {reading(args)}")
        run = replace(run, stop_on_signals=True)
        return job(lambda: _session(task), spec, run, report=BatchProgress(task))


def reading(args: argparse.Namespace) -> str:
    """What a job reads, and from where (`--from` counts on a new checkpoint only)."""
    streams = getattr(args, "stream", None) or f"{args.left} and {args.right}"
    return f"{streams} from {args.starting} (or where its checkpoint stopped)"


def _session(task: Task) -> SparkSession:
    from pipeline.spark.session import spark_session

    task.stage("starting Spark")
    return spark_session()


# --- mirror, export, console ----------------------------------------------------------------


def _add_mirror(jobs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = jobs.add_parser("mirror", parents=[common], help="copy a stream, exactly once")
    p.add_argument("--stream", required=True, help="source SCOPE/STREAM")
    p.add_argument("--to", required=True, help="target SCOPE/STREAM")
    p.add_argument(
        "--to-store",
        metavar="STORE",
        help="target store: a store's name in sluice.toml (cloud) or a URI (embedded:<dir>, "
        "relative to $SLUICE_HOME; pravega://host:9090); default: --store",
    )
    p.add_argument("--fixed-routing-key", metavar="KEY", help="one routing key for all")
    p.add_argument(
        "--commit-mode",
        choices=("auto", "tasks", "driver"),
        default="auto",
        help="who writes the target's transactions: tasks (needs a store that can flush one), "
        "driver (Pravega; or a target only the driver can reach), auto (by the target; default)",
    )
    p.set_defaults(func=_run_mirror, spec_of=mirror_spec)


def mirror_spec(args: argparse.Namespace) -> MirrorSpec:
    store = store_uri(args)
    return MirrorSpec(
        args.stream,
        args.to,
        store,
        args.to_store or store,
        args.fixed_routing_key,
        commit_mode=args.commit_mode,
    )


def _run_mirror(args: argparse.Namespace) -> int:
    spec, run = mirror_spec(args), run_options(args)
    check_stream(spec.store, spec.stream)
    return print_summary(_start(args, mirror, spec, run))


def _add_export(jobs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = jobs.add_parser("export", parents=[common], help="flatten a stream into files")
    p.add_argument("--stream", required=True, help="source SCOPE/STREAM")
    p.add_argument("--schema", required=True, help="an .avsc file or a bundled name")
    p.add_argument(
        "--output",
        required=True,
        type=Path,
        help=f"output directory; {OUTPUT_HELP}",
    )
    p.add_argument(
        "--format", default=",".join(DEFAULT_FORMATS), help="comma-separated: parquet, csv, jsonl"
    )
    p.add_argument(
        "--max-rows-per-file",
        type=int,
        default=MAX_ROWS_PER_FILE,
        help="a task starts a new file after this many rows",
    )
    p.add_argument("--time-field", help="event-time column (default: from the schema)")
    p.set_defaults(func=_run_export, spec_of=export_spec)


def export_spec(args: argparse.Namespace) -> ExportSpec:
    from pipeline.spark.options import ExportOptions

    formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
    unknown = [f for f in formats if f not in ExportOptions.FORMATS]
    if unknown or not formats:
        reason = "choose from parquet, csv, jsonl"
        raise UsageError(FORMAT_FLAG, args.format, reason)
    if args.max_rows_per_file <= 0:
        reason = "must be positive"
        raise UsageError(ROWS_FLAG, str(args.max_rows_per_file), reason)
    return ExportSpec(
        stream=args.stream,
        schema=args.schema,
        output=under_home(args.output),
        store=store_uri(args),
        formats=formats,
        max_rows_per_file=args.max_rows_per_file,
        time_field=args.time_field,
    )


def _run_export(args: argparse.Namespace) -> int:
    from pipeline.schemas import flatten_plan

    spec, run = export_spec(args), run_options(args)
    flatten_plan(spec.schema, spec.time_field)  # refuse a bad schema before Spark starts
    check_stream(spec.store, spec.stream)
    return print_summary(_start(args, export, spec, run))


def _add_console(jobs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = jobs.add_parser("console", parents=[common], help="print a stream's events")
    p.add_argument("--stream", required=True, help=STREAM_HELP)
    p.add_argument(
        "--max-chars",
        type=whole_number(MIN_CHARS, f"show at least {MIN_CHARS} characters of a payload"),
        default=MAX_CHARS,
        help=f"payload characters shown ({MIN_CHARS} or more; default {MAX_CHARS})",
    )
    p.set_defaults(func=_run_console, spec_of=console_spec)


def console_spec(args: argparse.Namespace) -> ConsoleSpec:
    return ConsoleSpec(args.stream, store_uri(args), max_chars=args.max_chars)


def _run_console(args: argparse.Namespace) -> int:
    spec, run = console_spec(args), run_options(args)
    check_stream(spec.store, spec.stream)
    summary = _start(args, console, spec, run)
    print(counted(summary.events, "event"), file=sys.stderr)
    return 0


# --- bookmark and the streaming join -------------------------------------------------------


def _add_bookmark(jobs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = jobs.add_parser("bookmark", parents=[common], help="record slices where a condition holds")
    p.add_argument("--stream", required=True, help="SCOPE/STREAM to watch")
    p.add_argument("--schema", required=True, help="Avro schema (bundled name or .avsc)")
    p.add_argument(
        "--sensor-by",
        default="routing_key",
        help="routing_key, or columns naming a sensor, e.g. RemoteAddr,Interface",
    )
    p.add_argument(
        "--below",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a slice where FIELD is below VALUE (repeatable)",
    )
    p.add_argument(
        "--above",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a slice where FIELD is above VALUE (repeatable)",
    )
    p.add_argument("--burst-mbps", type=float, help="a NIC's rx or tx rate above this many Mbit/s")
    p.add_argument(
        "--predicate",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="a slice where this function is true for a sample's row: it gets a pandas "
        "DataFrame of a batch's rows and returns one boolean per row (repeatable)",
    )
    p.add_argument("--min-samples", type=int, default=1, help="samples a slice needs")
    slices_stream_option(p)
    p.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help="who recorded the slices (their created_by; default bookmark)",
    )
    p.set_defaults(func=_run_bookmark, spec_of=bookmark_spec)


def bookmark_spec(args: argparse.Namespace) -> BookmarkSpec:
    conditions = conditions_of(args.below, args.above, args.burst_mbps, args.predicate)
    return BookmarkSpec(
        args.stream,
        args.schema,
        store_uri(args),
        conditions,
        args.sensor_by,
        args.slices_stream,
        args.name,
        args.min_samples,
    )


def _run_bookmark(args: argparse.Namespace) -> int:
    from pipeline.schemas import flatten_plan

    spec, run = bookmark_spec(args), run_options(args)
    check_conditions(spec)  # before Spark starts
    flatten_plan(spec.schema)
    check_stream(spec.store, spec.stream)
    return print_summary(_start(args, bookmark, spec, run))


def _add_join(jobs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = jobs.add_parser("join", parents=[common], help="time-series join of two streams")
    p.add_argument(
        "--left",
        required=True,
        metavar="SCOPE/STREAM[#KEY]",
        help="the left series: a stream, or one routing key of it",
    )
    p.add_argument(
        "--right",
        required=True,
        metavar="SCOPE/STREAM[#KEY]",
        help="the right series: a stream, or one routing key of it",
    )
    p.add_argument("--schema", required=True, help="Avro schema of both sides")
    p.add_argument("--time-column", default=TIME_COLUMN, help="the time column of both sides")
    p.add_argument(
        "--max-gap",
        type=float,
        metavar="SECONDS",
        help="pair records at most this far apart (default: any distance)",
    )
    p.add_argument(
        "--output",
        required=True,
        type=Path,
        help=f"directory of Parquet parts; {OUTPUT_HELP}",
    )
    p.set_defaults(func=_run_join, spec_of=join_spec)


def join_spec(args: argparse.Namespace) -> StreamJoinSpec:
    return StreamJoinSpec(
        SeriesSource.parse(args.left),
        SeriesSource.parse(args.right),
        args.schema,
        store_uri(args),
        under_home(args.output),
        args.time_column,
        args.max_gap,
    )


def _run_join(args: argparse.Namespace) -> int:
    spec, run = join_spec(args), run_options(args)
    for stream in {spec.left.stream, spec.right.stream}:
        check_stream(spec.store, stream)
    return print_summary(_start(args, join_streams, spec, run))
