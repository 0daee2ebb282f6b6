"""Running a streaming job: triggers, the `sluice` source, per-batch reports, the summary.

Every streaming job runs through `run_query` on its checkpoint: until caught up
(`--available-now`) or continuously, from `--from` on its first start and from the
checkpoint after, with one `BatchReport` per batch (`reports.py`). A `foreachBatch` job keeps
its state between batches with `BatchStates`. A job's spec gives its own command line through
`sluice_run` and `RunOptions.flags()`. A run until caught up that finds nothing to do
(`caught_up`: the checkpoint settled at every source's tail) returns before Spark starts, so a
job takes a session or a function that makes one. The shape of a job: `DESIGN.md`."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pipeline import durable
from pipeline.errors import SluiceError
from pipeline.jobs.checkpoint import (
    SettledPosition,
    planned_batch,
    settled_position,
)
from pipeline.jobs.in_process import (
    InProcessBatch,
    default_in_process_bytes,
    is_retryable,
    run_in_process,
)
from pipeline.jobs.reports import BatchReport, batch_counts, collect_reports, failure_reason
from pipeline.jobs.stopping import StopGate, StopRequest
from pipeline.jobs.truncation import truncated_reason, truncation_of
from pipeline.outputs import OutputNotWritable
from pipeline.spark.errors import OptionError
from pipeline.spark.options import SOURCE, cut_option, resolve_cut
from pipeline.spark.session import default_parallelism
from pipeline.streams import (
    InvalidCut,
    StreamCut,
    StreamStoreError,
    Truncated,
    open_store,
    parse_stream,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

    from pipeline.jobs.checkpoint import Checkpoint

    #: Makes (or returns) the process's session when a run needs Spark: a job takes one
    #: instead of a session so that a run with nothing to do starts no JVM.
    SessionFactory = Callable[[], SparkSession]

log = logging.getLogger(__name__)

Mode = Literal["available-now", "continuous"]


class JobFailed(SluiceError):
    """The Spark query of a job stopped with an error."""

    def __init__(self, job: str, reason: str) -> None:
        self.job, self.reason = job, reason
        msg = f"{job} job failed: {reason}"
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How a job runs: until caught up or continuously; where it starts; batch limits."""

    mode: Mode = "available-now"
    trigger_seconds: float = 10.0
    starting: str = "head"
    max_events: int | None = None
    max_bytes: int | None = None
    checkpoint: Path | None = None
    #: until caught up: a backlog of at most this many bytes runs as one batch in this
    #: process, without Spark (`in_process.py`); 0 always starts Spark; None: as
    #: `$SLUICE_IN_PROCESS_BYTES` says, else 32 MiB (read when the run starts)
    in_process_bytes: int | None = None
    #: continuous mode only: stop after this long, between two batches (for tests and
    #: scheduled runs; no flag)
    stop_after_seconds: float | None = None
    #: SIGTERM or SIGINT stops the query between two batches, a second one at once
    #: (`stopping.py`): the command line's choice (no flag); a caller with its own way of
    #: stopping (Dagster's run termination) leaves the signals alone
    stop_on_signals: bool = False

    def flags(self) -> list[str]:
        """The `sluice run` flags that ask for these options (none for a default)."""
        default, flags = RunOptions(), []
        if self.mode != default.mode:
            flags.append(f"--{self.mode}")
        if self.trigger_seconds != default.trigger_seconds:
            flags += ["--trigger", f"{flag_number(self.trigger_seconds)}s"]
        if self.starting != default.starting:
            flags += ["--from", self.starting]
        for flag, value in (("--max-events", self.max_events), ("--max-bytes", self.max_bytes)):
            if value is not None:
                flags += [flag, str(value)]
        if self.checkpoint is not None:
            flags += ["--checkpoint", str(self.checkpoint)]
        if self.in_process_bytes is not None:
            flags += ["--in-process-bytes", str(self.in_process_bytes)]
        return flags


#: How a job runs as a service: continuously, from its checkpoint.
SERVICE = RunOptions(mode="continuous")


def flag_number(value: float) -> str:
    """A number as a command-line value that parses back to the same float (`50`, `0.25`)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def sluice_run(store: str, job: str, job_flags: list[str], run: RunOptions) -> list[str]:
    """The argv of `sluice --store STORE run JOB …`: a spec's flags, then the run's."""
    return ["sluice", "--store", store, "run", job, *job_flags, *run.flags()]


@dataclass(frozen=True, slots=True)
class JobSummary:
    """A run's batches and totals; `outputs` names what it wrote (job-specific)."""

    job: str
    checkpoint: str
    batches: tuple[BatchReport, ...]
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> int:
        return sum(b.events for b in self.batches)

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)

    @property
    def quarantined(self) -> int:
        return sum(b.quarantined for b in self.batches)

    @property
    def start_cut(self) -> str | None:
        return self.batches[0].start_cut if self.batches else None

    @property
    def end_cut(self) -> str | None:
        return self.batches[-1].end_cut if self.batches else None

    @property
    def lag_bytes(self) -> int | None:
        return self.batches[-1].lag_bytes if self.batches else None


@dataclass(frozen=True, slots=True)
class JobSource:
    """The stream a job reads, and the rows it wants (`events`, or `ranges` for a sink that
    reads the store itself)."""

    store: str
    stream: str
    emit: Literal["events", "ranges"] = "events"


S = TypeVar("S")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class BatchStates(Generic[S]):
    """The state a `foreachBatch` job (bookmark, streaming join) carries from batch to batch,
    one file or directory per batch under `root` (`state-<batch>` + `suffix`).

    Batch N starts from the state of the latest batch before N and, once its output is out,
    saves its own under N (atomically); a batch whose state exists was done before a crash
    and is skipped. So a batch Spark re-runs sees the same state, and with idempotent output
    (deterministic ids or file names) the job is exactly-once. The last two states are kept.
    """

    root: Path
    fresh: Callable[[], S]
    load: Callable[[Path], S]
    save: Callable[[S, Path], None]
    suffix: str = ""

    def path(self, batch_id: int) -> Path:
        return self.root / f"state-{batch_id:012d}{self.suffix}"

    def run(self, batch_id: int, step: Callable[[S], R]) -> R | None:
        """`step(state)` for batch `batch_id` (it updates the state in place), then save the
        state; None when the batch was done before."""
        if self.path(batch_id).exists():
            return None
        saved = self._saved()
        earlier = [p for p in saved if int(p.name[6:18]) < batch_id]
        state = self.load(earlier[-1]) if earlier else self.fresh()
        result = step(state)
        with durable.atomic_path(self.path(batch_id)) as staging:
            self.save(state, staging)
        for old in self._saved()[:-2]:
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        return result

    def _saved(self) -> list[Path]:
        return sorted(self.root.glob(f"state-*{self.suffix}"))


def run_query(
    spark: SparkSession | SessionFactory,
    checkpoint: Checkpoint,
    *sources: JobSource,
    run: RunOptions,
    sink: Callable[[DataFrame, Checkpoint], DataStreamWriter],
    report: Callable[[BatchReport], None],
    in_process: InProcessBatch | None = None,
) -> tuple[BatchReport, ...]:
    """What every streaming job does on its acquired checkpoint: start at `--from` (first
    run) or where it stopped, read `sources` (one, or several unioned: the streaming join),
    write through `sink`, report each batch. A run until caught up that is caught up already
    (`caught_up`) runs no batch and never calls a session factory: Spark would plan nothing.
    One whose backlog is small runs it as one batch through `in_process`, when the job gives
    one, without Spark either (`in_process.py`). A `--from` that is no cut of its stream is
    refused before Spark starts. The query stops between two batches when asked
    (`stopping.py`)."""
    check_start(checkpoint.identity.job, run, sources)
    reports: list[BatchReport] = []
    for _ in range(2):  # a batch planned before this run and never finished, then the backlog
        standing = _standing(checkpoint, sources, run)
        if standing is None:
            break
        if standing.caught_up:
            if not reports:
                ends = ", ".join(cut.text for cut in standing.start)
                log.info(
                    "%s: nothing new since %s: Spark not started", checkpoint.identity.job, ends
                )
            return tuple(reports)
        done = _in_process(checkpoint, sources, run, standing, in_process) if in_process else None
        if done is None:
            break
        report(done)
        reports.append(done)
    else:
        return tuple(reports)
    if callable(spark):
        spark = spark()
    gate = StopGate(checkpoint.stop_dir, len(sources))
    gate.clear()
    stop = StopRequest(gate)
    # After the session: a local one's SparkContext puts its own SIGINT handler in place.
    with stop.installed() if run.stop_on_signals else nullcontext(stop):
        frames = [
            source_frame(
                spark,
                s.store,
                s.stream,
                resolve_start(checkpoint, run, s, (i, len(sources))),
                s.emit,
                stop=gate.source_options(i),
            )
            for i, s in enumerate(sources)
        ]
        events = frames[0]
        for frame in frames[1:]:
            events = events.unionByName(frame)
        writer = sink(events, checkpoint).option("checkpointLocation", str(checkpoint.spark_dir))
        query = with_trigger(writer, run).start()
        try:
            batches = await_query(
                checkpoint.identity.job,
                query,
                run,
                report,
                checkpoint.ledger_path,  # a sink without a ledger leaves none: counts from Spark
                first_start=checkpoint.start_cut,
                stop=stop,
            )
        except JobFailed as exc:
            truncated = truncation_of(exc.__cause__ or exc)
            if truncated is None:
                raise
            reason = truncated_reason(checkpoint, sources, truncated)
            raise JobFailed(checkpoint.identity.job, reason) from exc.__cause__
        return (*reports, *batches)


def check_start(job: str, run: RunOptions, sources: Sequence[JobSource]) -> None:
    """Refuse a `--from` that is no cut of each source's stream (`head` and `tail` always
    do), nor of that very stream (its id another's: the store's `StaleCut`), with the message
    the `sluice` source would give once Spark had started. Checked on every run, not only a
    checkpoint's first, where it counts: a service's command line that would fail on a new
    checkpoint fails at once, and a cut refused is never recorded as a checkpoint's start
    (every later run failed on it)."""
    for source in sources:
        try:
            if cut_option(source.stream, run.starting, "startingCut") is None:
                continue  # head or tail: of every stream
            with open_store(source.store, must_exist=True) as opened:
                resolve_cut(opened, source.stream, run.starting, "startingCut")
        except OptionError as exc:
            raise JobFailed(job, str(exc)) from exc
        except InvalidCut as exc:  # of another stream of its name, or id (`StaleCut`)
            said = OptionError(SOURCE, "startingCut", run.starting, f"{exc} (or use head / tail)")
            raise JobFailed(job, str(said)) from exc


def caught_up(
    checkpoint: Checkpoint, sources: Sequence[JobSource], run: RunOptions
) -> SettledPosition | None:
    """The checkpoint's position when a run until caught up (`available-now`) has nothing to
    do: nothing in doubt (`settled_position`) and every source's tail where the last batch
    ended. Spark's own restart would then plan no batch (the `sluice` source's latest offset
    is the tail: `pipeline/spark/reading.py`), so none is the same outcome without a JVM.

    None means there is work: a continuous run, a new checkpoint, a batch to finish, new
    events, a segment added by a scale, or anything unreadable (Spark says what is wrong).
    Read holding the checkpoint; the tails are read after it, so events appended meanwhile
    wait for the next run, as they would had they come after Spark's."""
    standing = _standing(checkpoint, sources, run)
    if standing is None or not standing.caught_up:
        return None
    return SettledPosition(standing.last, standing.start)


@dataclass(frozen=True, slots=True)
class _Standing:
    """Where a run until caught up stands before it starts Spark: the last committed batch,
    its end cuts (`start`), and either every source's tail or, when the batch after it was
    planned and never finished (`planned`), that batch's end cuts (`end`)."""

    last: int
    start: tuple[StreamCut, ...]
    end: tuple[StreamCut, ...]
    planned: bool

    @property
    def caught_up(self) -> bool:
        return not self.planned and self.end == self.start


def _standing(
    checkpoint: Checkpoint, sources: Sequence[JobSource], run: RunOptions
) -> _Standing | None:
    """Where the checkpoint of a run until caught up stands (`_Standing`); None when only
    Spark can say: a continuous run, a new checkpoint, more in doubt than one planned batch
    (`planned_batch`), a checkpoint of other streams, anything unreadable."""
    if run.mode != "available-now" or checkpoint.is_new:
        return None
    wanted = {"/".join(parse_stream(s.stream)): s.store for s in sources}
    try:
        planned = planned_batch(checkpoint.root)
        if planned is not None:
            standing = _Standing(
                planned.batch_id - 1, planned.start_cuts, planned.end_cuts, planned=True
            )
        else:
            position = settled_position(checkpoint.root)
            tails = {}
            for stream, store in wanted.items():
                with open_store(store) as opened:
                    tails[stream] = opened.tail(stream)
            end = tuple(tails.get(cut.stream, cut) for cut in position.end_cuts)
            standing = _Standing(position.batch_id, position.end_cuts, end, planned=False)
    except (SluiceError, OSError) as exc:  # InDoubt, unreadable, a stream gone: Spark says
        log.info("%s: Spark runs: %s", checkpoint.identity.job, exc)
        return None
    streams = [cut.stream for cut in standing.start]
    if len(set(streams)) != len(streams) or set(streams) != wanted.keys():
        return None
    return standing


def _in_process(
    checkpoint: Checkpoint,
    sources: Sequence[JobSource],
    run: RunOptions,
    standing: _Standing,
    batch: InProcessBatch,
) -> BatchReport | None:
    """The next batch in this process when it is small enough (`in_process.py`): one
    source, no batch limit, no segment added since the last batch, at most
    `run.in_process_bytes` bytes. None when Spark is to run it."""
    if len(sources) != 1 or run.max_events is not None or run.max_bytes is not None:
        return None
    (start,), (end,) = standing.start, standing.end
    if set(end.segments) != set(start.segments):
        return None  # a scale: Spark plans the successor segments
    backlog = start.bytes_until(end)
    limit = run.in_process_bytes
    if limit is None:
        limit = default_in_process_bytes()
    if not limit or backlog > limit:
        return None
    job = checkpoint.identity.job
    log.info("%s: %d bytes since %s: one batch in this process", job, backlog, start.text)
    source = sources[0]
    try:
        result = run_in_process(
            checkpoint.spark_dir,
            source.store,
            source.stream,
            batch_id=standing.last + 1,
            cuts=(start, end),
            planned=standing.planned,
            batch=batch,
        )
    except OutputNotWritable as exc:  # as Spark's query would have failed
        raise JobFailed(job, str(exc)) from exc
    except Truncated as exc:
        raise JobFailed(job, truncated_reason(checkpoint, sources, exc)) from exc
    except StreamStoreError as exc:
        if is_retryable(exc):
            raise
        raise JobFailed(job, str(exc)) from exc
    if result is None:
        return None
    counts = batch_counts(checkpoint.ledger_path, result.batch_id, result.input_rows)
    events, rows, quarantined = counts
    return BatchReport(
        job=job,
        batch_id=result.batch_id,
        start_cut=start.text,
        end_cut=end.text,
        events=events,
        rows=rows,
        quarantined=quarantined,
        lag_bytes=0,
        duration_ms=result.duration_ms,
        spark=False,
    )


def source_frame(
    spark: SparkSession,
    store: str,
    stream: str,
    run: RunOptions,
    emit: str = "events",
    *,
    stop: dict[str, str] | None = None,
) -> DataFrame:
    """The `sluice` streaming source over `stream`, as the run options ask; `stop` connects
    it to the query's `StopGate`."""
    reader = (
        spark.readStream.format("sluice")
        .option("store", store)
        .option("stream", stream)
        .option("startingCut", run.starting)
        .option("minPartitions", str(max(2, default_parallelism(spark))))
        .option("emit", emit)
        .options(**(stop or {}))
    )
    if run.max_events is not None:
        reader = reader.option("maxEventsPerTrigger", str(run.max_events))
    if run.max_bytes is not None:
        reader = reader.option("maxBytesPerTrigger", str(run.max_bytes))
    return reader.load()


def resolve_start(
    checkpoint: Checkpoint, run: RunOptions, source: JobSource, place: tuple[int, int] = (0, 1)
) -> RunOptions:
    """On a new checkpoint, `--from head|tail` as the cut it stands for now in `source` (the
    first of `place`: which source, of how many), recorded in the checkpoint, so that every
    report of a first batch can name where it began. Once recorded, that cut is the start of
    every later run: a run killed before Spark committed batch 0 has Spark plan it (again)
    from the source's `startingCut`, and `tail` resolved anew would skip the events since the
    recorded one."""
    recorded = checkpoint.start_of(*place)
    if recorded is not None:
        return replace(run, starting=recorded)
    if not checkpoint.is_new:
        return run
    start = run.starting
    if start.lower() in ("head", "tail", "latest"):
        with open_store(source.store) as opened:
            head = start.lower() == "head"
            cut = opened.head(source.stream) if head else opened.tail(source.stream)
        start = cut.text
    checkpoint.record_start(start, *place)
    return replace(run, starting=start)


def with_trigger(writer: DataStreamWriter, run: RunOptions) -> DataStreamWriter:
    if run.mode == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=f"{run.trigger_seconds} seconds")


def await_query(
    job: str,
    query: StreamingQuery,
    run: RunOptions,
    report: Callable[[BatchReport], None],
    ledger: Path | None = None,
    *,
    first_start: str | None = None,
    stop: StopRequest | None = None,
) -> tuple[BatchReport, ...]:
    """Wait for the query, reporting each batch; stop it when `stop` asks (a signal, with
    `run.stop_on_signals`), after `stop_after_seconds`, or on a KeyboardInterrupt (a caller
    that leaves SIGINT to pyspark: at once).

    `first_start` names the start of a checkpoint's first batch (Spark reports none)."""
    stop = stop or StopRequest()
    seen: dict[int, BatchReport] = {}
    started = time.monotonic()
    try:
        while not query.awaitTermination(0.5):
            collect_reports(job, query, (ledger, first_start), seen, report)
            if run.stop_after_seconds and time.monotonic() - started > run.stop_after_seconds:
                stop.ask(f"{flag_number(run.stop_after_seconds)} s are up")
            stop.act(query)
    except KeyboardInterrupt:
        query.stop()
    except Exception as exc:  # StreamingQueryException: the query died
        raise JobFailed(job, failure_reason(exc)) from exc
    collect_reports(job, query, (ledger, first_start), seen, report)
    return tuple(seen[k] for k in sorted(seen))
