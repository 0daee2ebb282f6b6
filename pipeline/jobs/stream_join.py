"""The streaming join job (`sluice run join`): two series from streams, joined as they arrive.

    sluice run join --left examples/machine#r --right examples/machine#s \\
        --schema NetworkSamples --time-column TimestampNanos --output out/ --available-now

Each side is a stream, optionally one routing key of it, flattened through an Avro schema and
fed batch by batch to a `StreamingJoin` (`pipeline/timejoin.py`). Delivery: **exactly-once
pairs** (batch N writes `part-<N>.parquet`, then saves the joiner's state under N). Order
requirements and what is final when: `DESIGN.md`, "the streaming join". A checkpoint keeps
the schema, time column and max gap its pairs were made with (`JoinParameters`): a run with
others is refused, never mixed into the same output, and an output has one checkpoint: a new
one is refused where another's parts are (`JoinOutputTaken`). Tests SIGKILL the driver at the
named points where a crash matters to exactly-once (`Failpoints`,
`$SLUICE_TEST_JOIN_FAILPOINTS`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import durable
from pipeline.errors import SluiceError
from pipeline.failpoints import Failpoints
from pipeline.jobs import output_claim
from pipeline.jobs.checkpoint import Checkpoint, JobIdentity, default_checkpoint
from pipeline.jobs.runner import (
    SERVICE,
    BatchReport,
    BatchStates,
    JobFailed,
    JobSource,
    JobSummary,
    RunOptions,
    flag_number,
    run_query,
    sluice_run,
)
from pipeline.outputs import check_writable, refused_writes
from pipeline.streams.names import check_routing_key
from pipeline.timejoin import (
    InvalidMaxGap,
    JoinInputError,
    Side,
    StreamingJoin,
    check_max_gap,
    gap_in_units,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from pipeline.schemas import FlattenPlan

log = logging.getLogger(__name__)

NS = 1_000_000_000
TIME_COLUMN = "TimestampNanos"
#: What running the join again does after its disk refused a write (`OutputNotWritable`)
RERUN = "the join is exactly-once, so its next run re-runs the batch and writes its pairs once"
PARAMETERS_VERSION = 1
#: `NAME[:HIT],…`: the driver SIGKILLs itself (and its process group, when it leads one) the
#: HIT-th time it reaches NAME (`pipeline/failpoints.py`; a switch of the test suite)
FAILPOINTS_ENV = "SLUICE_TEST_JOIN_FAILPOINTS"
#: The points of a batch where a crash matters: half of its part file in staging (no footer
#: yet), the part published and the joiner's state not saved, the state saved and the batch
#: not yet committed by Spark.
FAILPOINTS = ("join.in_part", "join.after_part", "join.after_state")


@dataclass(frozen=True, slots=True)
class SeriesSource:
    """A stream, and optionally the one routing key that is the series (None: every event
    of the stream; the empty text is the empty key, which the store allows)."""

    stream: str
    routing_key: str | None = None

    def __post_init__(self) -> None:
        check_routing_key(self.routing_key)

    @classmethod
    def parse(cls, text: str) -> SeriesSource:
        """`STREAM` or `STREAM#KEY`. A stream's name holds no `#`, so the first `#` ends it and
        the key is everything after it as it is: `#`s, spaces, nothing at all (`STREAM#` is
        the empty key, not the whole stream). A key the store could not hold is refused
        (`InvalidRoutingKey`): it would name no event, and the join would wait forever."""
        stream, sep, key = text.partition("#")
        return cls(stream, key if sep else None)

    @property
    def text(self) -> str:
        """`STREAM#KEY` (or `STREAM`), as `parse` reads it."""
        return self.stream if self.routing_key is None else f"{self.stream}#{self.routing_key}"

    @property
    def checkpoint_text(self) -> str:
        """The series as checkpoints name it: `STREAM#KEY`, and `STREAM#None` for every event
        (the name checkpoints have always had), with a NUL before the one key that would read
        alike, "None", and before keys that begin with a NUL: one name per series."""
        key = self.routing_key
        if key is not None and (key == "None" or key.startswith("\0")):
            key = "\0" + key
        return f"{self.stream}#{key}"

    def select(self, events: pa.Table) -> pa.Table:
        mask = pc.equal(events["stream"], self.stream)
        if self.routing_key is not None:
            mask = pc.and_(mask, pc.equal(events["routing_key"], self.routing_key))
        return events.filter(mask)


@dataclass(frozen=True, slots=True)
class StreamJoinSpec:
    """The two series, their schema, and the directory of Parquet parts (made absolute)."""

    left: SeriesSource
    right: SeriesSource
    schema: str
    store: str
    output: Path
    time_column: str = TIME_COLUMN
    max_gap_seconds: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", Path(self.output).absolute())

    def command_line(self, run: RunOptions = SERVICE) -> list[str]:
        """The `sluice run join …` argv that runs exactly this spec."""
        flags = ["--left", self.left.text, "--right", self.right.text, "--schema", self.schema]
        if self.time_column != TIME_COLUMN:
            flags += ["--time-column", self.time_column]
        if self.max_gap_seconds is not None:
            flags += ["--max-gap", flag_number(self.max_gap_seconds)]
        flags += ["--output", str(self.output)]
        return sluice_run(self.store, "join", flags, run)


@dataclass(frozen=True, slots=True)
class JoinParameters:
    """What a checkpoint's pairs were joined with (`<checkpoint>/join/parameters.json`)."""

    schema: str
    time_column: str
    max_gap_seconds: float | None
    version: int = PARAMETERS_VERSION

    @classmethod
    def of(cls, spec: StreamJoinSpec) -> JoinParameters:
        return cls(spec.schema, spec.time_column, spec.max_gap_seconds)

    def describe(self) -> str:
        gap = "none" if self.max_gap_seconds is None else flag_number(self.max_gap_seconds)
        return f"schema {self.schema}, time column {self.time_column!r}, max gap {gap}"


class JoinOutputTaken(SluiceError, ValueError):
    """A join checkpoint that has written nothing yet, and an output that holds another
    checkpoint's parts: its batches would write parts of the same names again."""

    def __init__(self, output: Path, checkpoint: Path, found: Path) -> None:
        self.output, self.checkpoint, self.found = output, checkpoint, found
        msg = (
            f"join output {output} holds pairs another checkpoint wrote, such as {found.name}, "
            f"and this run's checkpoint {checkpoint} has written none: its batches would write "
            "parts of the same names again, and pairs would be replaced or counted twice. Go "
            "on with that join (its --checkpoint), or join into a new --output"
        )
        super().__init__(msg)


def claim_output(root: Path, spec: StreamJoinSpec) -> None:
    """Make the join state under `root` the one that writes `spec.output`: refused
    (`JoinOutputTaken`) when the state is new and the output already holds parts, whoever
    wrote them (another checkpoint, one since lost) and however the output is spelled (a
    symbolic link to it, a path through `..` whose first part does not exist yet), or
    `OutputClaimed` when another checkpoint claimed the output before writing any part.
    Recording the parameters marks the state as begun, before its first part is written."""
    begun = (root / "parameters.json").exists() or any(root.glob("state-*"))
    if not begun:
        here = spec.output.resolve()  # `other/../out` before `other` exists: its parts are out's
        found = next(iter(sorted(here.glob("part-*.parquet"))), None)
        if found is not None:
            raise JoinOutputTaken(spec.output, root.parent, found)
    output_claim.claim("join", spec.output, root.parent)
    if not begun:
        durable.write_json(root / "parameters.json", asdict(JoinParameters.of(spec)))


class JoinParametersChanged(SluiceError, ValueError):
    """A run of the join on a checkpoint whose state and pairs were made with other parameters."""

    def __init__(self, root: Path, recorded: str, wanted: str) -> None:
        self.root, self.recorded, self.wanted = root, recorded, wanted
        msg = (
            f"join checkpoint {root} was made with {recorded}, not {wanted}: its buffered "
            "records and the pairs already written used those; run again with them, or give "
            "a new --checkpoint and --output to join with the new ones"
        )
        super().__init__(msg)


def check_parameters(root: Path, spec: StreamJoinSpec, gap: float | None) -> None:
    """Refuse to continue the join state under `root` with other parameters than it was made
    with (`gap`: the max gap in time units, as a state from before `parameters.json` has it)."""
    wanted = JoinParameters.of(spec)
    path = root / "parameters.json"
    if path.exists():
        recorded = JoinParameters(**json.loads(path.read_text()))
        if recorded != wanted:
            raise JoinParametersChanged(root.parent, recorded.describe(), wanted.describe())
        return
    states = sorted(root.glob("state-*/join.json"))
    if states:
        state = json.loads(states[-1].read_text())
        if (state["time_column"], state["max_gap"]) != (spec.time_column, gap):
            recorded = f"time column {state['time_column']!r}, max gap {state['max_gap']!r}"
            wanted_units = f"time column {spec.time_column!r}, max gap {gap!r}"
            raise JoinParametersChanged(root.parent, recorded, wanted_units)


def _gap_in_units(plan: FlattenPlan, spec: StreamJoinSpec) -> float | None:
    """`--max-gap` seconds in the time column's unit (ns for `*Nanos`, else seconds)."""
    if plan.time is not None and plan.time.name == spec.time_column:
        return gap_in_units(spec.max_gap_seconds, NS / plan.time.ns_per_unit)
    return spec.max_gap_seconds


def _series_rows(plan: FlattenPlan, events: pa.Table, time_column: str) -> pa.Table:
    """Flattened rows of one side's events, in time order (stable: stream order for ties)."""
    from pipeline.schemas import Events, flatten

    rows = flatten(plan, Events.from_arrow(events)).rows
    order = np.argsort(rows[time_column].to_numpy(), kind="stable")
    return rows.take(pa.array(order))


def process_batch(
    spec: StreamJoinSpec,
    plan: FlattenPlan,
    root: Path,
    batch_id: int,
    events: pa.Table,
    *,
    failpoints: Failpoints | None = None,
) -> int:
    """Feed one micro-batch to the joiner; write its final pairs; return how many."""
    failpoints = failpoints or Failpoints()
    events = events.sort_by(
        [("stream", "ascending"), ("segment", "ascending"), ("offset", "ascending")]
    )

    def step(joiner: StreamingJoin) -> int:
        parts = []
        sides: tuple[tuple[Side, SeriesSource], ...] = (("left", spec.left), ("right", spec.right))
        before = {side: joiner.buffered(side) for side, _ in sides}
        for side, source in sides:
            out = joiner.push(side, _series_rows(plan, source.select(events), spec.time_column))
            if out is not None:
                parts.append(out)
        _say_who_waits(spec, joiner, before)
        if not parts:
            return 0
        rows = pa.concat_tables(parts)
        _publish(spec.output, batch_id, rows, failpoints)
        failpoints.hit("join.after_part")
        return rows.num_rows

    gap = _gap_in_units(plan, spec)
    check_parameters(root, spec, gap)
    states = BatchStates(
        root,
        fresh=lambda: StreamingJoin(spec.time_column, gap),
        load=StreamingJoin.load,
        save=lambda joiner, path: joiner.save(path),
    )
    # A batch done before a crash has its part file published already.
    done = states.run(batch_id, step)
    if not (root / "parameters.json").exists():
        durable.write_json(root / "parameters.json", asdict(JoinParameters.of(spec)))
    if done is not None:
        failpoints.hit("join.after_state")
    return done or 0


#: A side with this many rows kept (waiting for the other series to pass their time) is
#: reported, and again each time the count doubles: a sensor of the other side that stopped
#: writing leaves every row of this one waiting, in memory and in the state of each batch.
WAITING_ROWS = 1_000_000


def _doublings(rows: int) -> int:
    """0 below `WAITING_ROWS`, then 1, 2, 3... at each doubling past it."""
    return (rows // WAITING_ROWS).bit_length()


def _say_who_waits(spec: StreamJoinSpec, joiner: StreamingJoin, before: dict[Side, int]) -> None:
    for side, other, source in (("left", "right", spec.right), ("right", "left", spec.left)):
        now = joiner.buffered(side)
        if _doublings(now) <= _doublings(before[side]):
            continue
        latest = joiner.latest(other)
        since = "no record of it yet" if latest is None else f"its latest time is {latest:.0f}"
        log.warning(
            "join: %s %s rows wait for the %s series %s (%s): a pair is final only once "
            "both series have passed its time; check that its sensor still writes",
            f"{now:,}",
            side,
            other,
            source.text,
            since,
        )


def _publish(output: Path, batch_id: int, rows: pa.Table, failpoints: Failpoints) -> None:
    """Write a batch's part file (staged, then renamed: a reader never sees a part of it); a
    disk that refuses it is `OutputNotWritable`, and the batch's state is not saved, so the
    batch runs again. Two row groups, with `join.in_part` between them: a crash there leaves
    a staging file without a footer, as a crash in the middle of the write does."""
    import pyarrow.parquet as pq

    half = rows.num_rows // 2
    with (
        refused_writes(output, RERUN),
        durable.atomic_path(output / f"part-{batch_id:012d}.parquet") as staging,
        pq.ParquetWriter(staging, rows.schema, compression="zstd") as parquet,
    ):
        if half:
            parquet.write_table(rows.slice(0, half))
        failpoints.hit("join.in_part")
        parquet.write_table(rows.slice(half))


def check_spec(spec: StreamJoinSpec) -> FlattenPlan:
    """The spec's flatten plan, once what a batch would refuse is refused (before Spark
    starts): a time column the schema lacks, a max gap that is no number of seconds, an
    output directory that cannot be written."""
    from pipeline.schemas import flatten_plan

    check_writable(spec.output)
    plan = flatten_plan(spec.schema)
    if spec.time_column not in plan.arrow_schema.names:
        reason = f"schema {spec.schema} has no column {spec.time_column!r}"
        raise JoinInputError(spec.left.stream, reason)
    try:
        check_max_gap(spec.max_gap_seconds)
    except InvalidMaxGap as exc:
        job = "join"
        raise JobFailed(job, str(exc)) from exc
    return plan


def _foreach(
    spec: StreamJoinSpec, plan: FlattenPlan, root: Path, failpoints: Failpoints
) -> Callable[[DataFrame, int], None]:
    def run_batch(batch: DataFrame, batch_id: int) -> None:
        process_batch(spec, plan, root, batch_id, batch.toArrow(), failpoints=failpoints)

    return run_batch


def join_sources(spec: StreamJoinSpec) -> str:
    """The two series as the join's checkpoint names them."""
    return f"{spec.left.checkpoint_text} x {spec.right.checkpoint_text}"


def join_identity(spec: StreamJoinSpec) -> JobIdentity:
    """What the join's checkpoint records (`job.json`): both series, with their store, and
    the output as given."""
    return JobIdentity("join", f"{spec.store}#{join_sources(spec)}", str(spec.output))


def join_checkpoint(spec: StreamJoinSpec) -> Path:
    """The checkpoint `sluice run join` uses without `--checkpoint`."""
    return default_checkpoint(join_identity(spec), join_sources(spec), str(spec.output))


def join_streams(
    spark: SparkSession,
    spec: StreamJoinSpec,
    run: RunOptions,
    report: Callable[[BatchReport], None] = lambda _: None,
    failpoints: Failpoints | None = None,
) -> JobSummary:
    """Run the join job (see the module doc) until caught up or stopped; `failpoints`: those
    of `$SLUICE_TEST_JOIN_FAILPOINTS` unless given."""
    plan = check_spec(spec)
    if failpoints is None:
        failpoints = Failpoints.from_environment(FAILPOINTS_ENV, known=FAILPOINTS, group=True)
    sources = join_sources(spec)
    identity = join_identity(spec)
    root = run.checkpoint or join_checkpoint(spec)

    def sink(events: DataFrame, checkpoint: Checkpoint) -> DataStreamWriter:
        process = _foreach(spec, plan, checkpoint.root / "join", failpoints)
        return events.writeStream.foreachBatch(process).queryName(f"join {sources}")

    with Checkpoint(root, identity) as checkpoint:
        check_parameters(checkpoint.root / "join", spec, _gap_in_units(plan, spec))
        claim_output(checkpoint.root / "join", spec)
        durable.remove_abandoned(spec.output)  # part files of a driver killed as it wrote
        streams = dict.fromkeys([spec.left.stream, spec.right.stream])
        inputs = [JobSource(spec.store, stream) for stream in streams]
        batches = run_query(spark, checkpoint, *inputs, run=run, sink=sink, report=report)
        return JobSummary("join", str(checkpoint.root), batches, {"output": str(spec.output)})
