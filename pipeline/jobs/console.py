"""The console job: print a stream's events, human-readably, from head or tail, following.

    2026-11-22T04:13:57.210Z  examples/network  0@1024  key=site-1  {"TimestampNanos":[…

One line per event, in stream order within each batch; the payload as UTF-8 text cut to
`max_chars` (with its full size), or hex when it is not UTF-8. Delivery: **at-least-once** —
each batch is printed from the driver once it is read, and a batch Spark re-runs after a
crash is printed again (printing is not transactional); with a checkpoint, a later run
resumes after the last batch printed.

When the reader of the output goes away (`sluice run console … | head`: `OutputClosed`), the
batch being printed is cut short: the job stops printing, the query stops after that batch
(`stopping.py`), and the batch is left undone, as a crash would leave it (no commit log
entry), so a later run prints it again from its first event. Then `OutputClosed` ends the
run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pipeline import durable
from pipeline.errors import OutputClosed
from pipeline.jobs.checkpoint import Checkpoint, JobIdentity, default_checkpoint
from pipeline.jobs.in_process import events_batch
from pipeline.jobs.runner import (
    SERVICE,
    BatchReport,
    JobSource,
    JobSummary,
    RunOptions,
    run_query,
    sluice_run,
)
from pipeline.jobs.stopping import StopGate

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

MAX_CHARS = 200
#: The fewest payload characters `--max-chars` may show (a shorter cut says nothing).
MIN_CHARS = 20
#: Why the query stops when the output's reader went away (`StopRequest`'s log line).
OUTPUT_CLOSED = "the reader of standard output went away"


@dataclass(frozen=True, slots=True)
class ConsoleSpec:
    """Which stream to print, and how much of each payload."""

    stream: str
    store: str
    max_chars: int = MAX_CHARS

    def command_line(self, run: RunOptions = SERVICE) -> list[str]:
        """The `sluice run console …` argv that runs exactly this spec."""
        flags = ["--stream", self.stream]
        if self.max_chars != MAX_CHARS:
            flags += ["--max-chars", str(self.max_chars)]
        return sluice_run(self.store, "console", flags, run)


def format_event(row: dict, max_chars: int) -> str:
    """One human-readable line for an event (a row of the `sluice` source)."""
    payload, key = row["payload"], row["routing_key"]
    when = (
        row["ingest_time"].astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )
    try:
        text = payload.decode("utf-8").replace("\n", " ")
    except UnicodeDecodeError:
        text = f"<not UTF-8> {payload[: max_chars // 2].hex()}"
    if len(text) > max_chars:
        text = f"{text[:max_chars]}… ({len(payload)} bytes)"
    where = f"{row['stream']}  {row['segment']}@{row['offset']}"
    return f"{when}  {where}  key={key if key is not None else '-'}  {text}"


def _print_events(spec: ConsoleSpec, out: TextIO) -> Callable[[pa.Table, int], None]:
    """A batch's events (the `sluice` source's columns, as Arrow) printed in stream order;
    a small backlog's batch run without Spark gets this directly (`in_process.py`)."""

    def print_events(events: pa.Table, batch_id: int) -> None:
        table = events.sort_by([("segment", "ascending"), ("offset", "ascending")])
        for row in table.to_pylist():
            out.write(format_event(row, spec.max_chars) + "\n")
        out.flush()

    return print_events


class _Printer:
    """The `foreachBatch` function (on the driver, in a py4j thread). An exception raised
    here fails the query with Spark's and py4j's tracebacks, so a closed output is not one:
    the batch stops printing, the query is asked to stop after it, and `cut_short` names it
    (the module doc)."""

    def __init__(self, spec: ConsoleSpec, out: TextIO, gate: StopGate) -> None:
        self.print_events = _print_events(spec, out)
        self.gate = gate
        self.cut_short: int | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self.cut_short is not None:
            return  # no batch is planned after the stop was asked; were one, it is undone too
        try:
            self.print_events(batch.toArrow(), batch_id)
        except OutputClosed:
            self.cut_short = batch_id
            self.gate.close(OUTPUT_CLOSED)


def _undo(spark_dir: Path, first: int) -> None:
    """Remove Spark's commit log entries of batch `first` and after (their offset log
    entries stay): those batches are planned and not done, as after a driver crash between
    the sink and the commit log, and the next run re-runs them. Call it with the query
    stopped, holding the checkpoint."""
    commits = spark_dir / "commits"
    for entry in list(commits.iterdir()):
        if entry.name.isdigit() and int(entry.name) >= first:
            (commits / f".{entry.name}.crc").unlink(missing_ok=True)
            entry.unlink()
    durable.fsync_dir(commits)


def console_identity(spec: ConsoleSpec) -> JobIdentity:
    """What the console job's checkpoint records (`job.json`): the stream, with its store."""
    return JobIdentity("console", f"{spec.store}#{spec.stream}", "console")


def console_checkpoint(spec: ConsoleSpec) -> Path:
    """The checkpoint `sluice run console` uses without `--checkpoint`."""
    return default_checkpoint(console_identity(spec), spec.stream, "console")


def console(
    spark: SparkSession,
    spec: ConsoleSpec,
    run: RunOptions,
    out: TextIO | None = None,
    report: Callable[[BatchReport], None] = lambda _: None,
) -> JobSummary:
    """Print the stream's events until caught up, or follow it (`continuous`)."""
    identity = console_identity(spec)
    root = run.checkpoint or console_checkpoint(spec)

    with Checkpoint(root, identity) as checkpoint:
        checkpoint.note_start(run.starting)
        printer = _Printer(spec, out or sys.stdout, StopGate(checkpoint.stop_dir, 1))

        def sink(events: DataFrame, checkpoint: Checkpoint) -> DataStreamWriter:
            return events.writeStream.foreachBatch(printer).queryName(f"console {spec.stream}")

        source = JobSource(spec.store, spec.stream)
        # In this process a closed output ends the batch before its commit log entry.
        small = events_batch(_print_events(spec, out or sys.stdout))
        batches = run_query(
            spark, checkpoint, source, run=run, sink=sink, report=report, in_process=small
        )
        if printer.cut_short is not None:
            _undo(checkpoint.spark_dir, printer.cut_short)
            raise OutputClosed
        return JobSummary("console", str(checkpoint.root), batches, {})
