"""`sluice run <job> …`: the streaming jobs on the command line.

    sluice run mirror  --stream SCOPE/STREAM --to SCOPE/STREAM [--to-store URI]
                       [--fixed-routing-key K] [--commit-mode auto|tasks|driver]
    sluice run export  --stream SCOPE/STREAM --schema FILE.avsc|NAME --output DIR
                       [--format parquet,csv,jsonl]
    sluice run console --stream SCOPE/STREAM

each with `[--checkpoint DIR]` (default under `$SLUICE_HOME/checkpoints/`), `--available-now`
(the default: stop when caught up) or `--continuous [--trigger 10s]`, `--from head|tail|CUT`
(first start only), `--max-events N` / `--max-bytes N` per batch. Each batch prints one line
(cut range, events, rows, quarantined, lag) on stderr; the summary is JSON on stdout.

Adding a job (for example `sluice run bookmark`): write, in your own module,

    def register_run(jobs, common):
        parser = jobs.add_parser("bookmark", parents=[common], help="…")
        parser.add_argument("--stream", required=True)
        parser.set_defaults(func=_run_bookmark)

    def _run_bookmark(args):
        run = run_options(args)                 # RunOptions from the common flags
        spark = job_session()                   # the process's Spark session
        summary = bookmark(spark, …, run, report=print_report)
        return print_summary(summary)

and add `"your.module:register_run"` to `JOB_REGISTRARS` below (one line). `common` already
holds the flags every job shares (`--checkpoint`, `--available-now/--continuous`,
`--trigger`, `--from`, `--max-events`, `--max-bytes`); `pipeline.jobs.runner` has the
query runner (`source_frame`, `with_trigger`, `await_query`) that gives per-batch reports.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import SluiceError
from pipeline.jobs.runner import BatchReport, JobSummary, RunOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TRIGGER_FLAG, FORMAT_FLAG, ROWS_FLAG = "--trigger", "--format", "--max-rows-per-file"
JOB_REGISTRARS = (
    "pipeline.jobs.commands:register_builtin",  # mirror, export, console
    "pipeline.jobs.bookmark:register_run",  # bookmark
    "pipeline.jobs.stream_join:register_run",  # join
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
    for target in JOB_REGISTRARS:
        module, _, function = target.partition(":")
        getattr(importlib.import_module(module), function)(jobs, common)


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
    return RunOptions(
        mode=args.mode,
        trigger_seconds=parse_interval(args.trigger),
        starting=args.starting,
        max_events=args.max_events,
        max_bytes=args.max_bytes,
        checkpoint=args.checkpoint,
    )


def store_uri(args: argparse.Namespace) -> str:
    from pipeline.config import default_store_uri

    return args.store or default_store_uri()


def check_stream(store: str, stream: str) -> None:
    """Fail fast (before Spark starts) when the stream does not exist."""
    from pipeline.streams import open_store

    with open_store(store) as opened:
        opened.info(stream)


def job_session() -> SparkSession:
    from pipeline.spark.session import spark_session

    return spark_session()


def print_report(report: BatchReport) -> None:
    print(report.line(), file=sys.stderr, flush=True)


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


# --- the built-in jobs --------------------------------------------------------------------


def register_builtin(jobs: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    mirror = jobs.add_parser("mirror", parents=[common], help="copy a stream, exactly once")
    mirror.add_argument("--stream", required=True, help="source SCOPE/STREAM")
    mirror.add_argument("--to", required=True, help="target SCOPE/STREAM")
    mirror.add_argument("--to-store", metavar="URI", help="target store (default: --store)")
    mirror.add_argument("--fixed-routing-key", metavar="KEY", help="one routing key for all")
    mirror.add_argument(
        "--commit-mode",
        choices=("auto", "tasks", "driver"),
        default="auto",
        help="who writes the target's transactions: tasks (needs a store that can flush one), "
        "driver (Pravega; or a target only the driver can reach), auto (by the target; default)",
    )
    mirror.set_defaults(func=_run_mirror)

    export = jobs.add_parser("export", parents=[common], help="flatten a stream into files")
    export.add_argument("--stream", required=True, help="source SCOPE/STREAM")
    export.add_argument("--schema", required=True, help="an .avsc file or a bundled name")
    export.add_argument("--output", required=True, type=Path, help="output directory")
    export.add_argument("--format", default="parquet,csv", help="parquet,csv,jsonl")
    export.add_argument("--max-rows-per-file", type=int, default=1_000_000)
    export.add_argument("--time-field", help="event-time column (default: from the schema)")
    export.set_defaults(func=_run_export)

    console = jobs.add_parser("console", parents=[common], help="print a stream's events")
    console.add_argument("--stream", required=True, help="SCOPE/STREAM")
    console.add_argument("--max-chars", type=int, default=200, help="payload characters shown")
    console.set_defaults(func=_run_console)


def _run_mirror(args: argparse.Namespace) -> int:
    from pipeline.jobs.mirror import MirrorSpec, mirror

    store = store_uri(args)
    spec = MirrorSpec(
        args.stream,
        args.to,
        store,
        args.to_store or store,
        args.fixed_routing_key,
        commit_mode=args.commit_mode,
    )
    run = run_options(args)
    check_stream(store, args.stream)
    return print_summary(mirror(job_session(), spec, run, report=print_report))


def _run_export(args: argparse.Namespace) -> int:
    from pipeline.jobs.export import ExportSpec, export
    from pipeline.schemas import flatten_plan
    from pipeline.spark.options import ExportOptions

    formats = tuple(f.strip().lower() for f in args.format.split(",") if f.strip())
    unknown = [f for f in formats if f not in ExportOptions.FORMATS]
    if unknown or not formats:
        reason = "choose from parquet, csv, jsonl"
        raise UsageError(FORMAT_FLAG, args.format, reason)
    if args.max_rows_per_file <= 0:
        reason = "must be positive"
        raise UsageError(ROWS_FLAG, str(args.max_rows_per_file), reason)
    flatten_plan(args.schema, args.time_field)  # refuse a bad schema before Spark starts
    check_stream(store_uri(args), args.stream)
    spec = ExportSpec(
        stream=args.stream,
        schema=args.schema,
        output=args.output,
        store=store_uri(args),
        formats=formats,
        max_rows_per_file=args.max_rows_per_file,
        time_field=args.time_field,
    )
    return print_summary(export(job_session(), spec, run_options(args), report=print_report))


def _run_console(args: argparse.Namespace) -> int:
    from pipeline.jobs.console import ConsoleSpec, console

    spec = ConsoleSpec(args.stream, store_uri(args), max_chars=max(20, args.max_chars))
    check_stream(spec.store, spec.stream)
    summary = console(job_session(), spec, run_options(args), report=print_report)
    print(f"{summary.events} events", file=sys.stderr)
    return 0
