"""The mirror job: copy a stream into another stream, exactly once, keeping per-key order.

    summary = mirror(spark, MirrorSpec("examples/network", "edge-site-1/network",
                                       store="embedded:/edge", to_store="embedded:/cloud",
                                       fixed_routing_key="site-1"), RunOptions())

The target may be in another scope, store or a Pravega cluster; `fixed_routing_key` gives all
events one key (one per edge site). Delivery: **exactly-once** (the `sluice` sink commits a
batch once, by the ledger); per-key order kept. A checkpoint keeps its `fixed_routing_key`: a
run with another is refused (`ParametersChanged`), never mixed into the target stream; a new
checkpoint into a target that holds events already is refused (`TargetTaken`).
`commit_mode`: `DESIGN.md`, "mirror"."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.config import same_store
from pipeline.errors import SluiceError
from pipeline.jobs.checkpoint import Checkpoint, JobIdentity, JobParameters, default_checkpoint
from pipeline.jobs.in_process import stream_writer_batch
from pipeline.jobs.runner import (
    SERVICE,
    BatchReport,
    JobSource,
    JobSummary,
    RunOptions,
    run_query,
    sluice_run,
)
from pipeline.streams import open_store
from pipeline.streams.names import check_routing_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from pipeline.jobs.runner import SessionFactory
    from pipeline.spark.options import CommitMode


@dataclass(frozen=True, slots=True)
class MirrorSpec:
    """What to copy where."""

    stream: str
    to: str
    store: str
    to_store: str
    fixed_routing_key: str | None = None
    commit_mode: CommitMode = "auto"

    def __post_init__(self) -> None:
        check_routing_key(self.fixed_routing_key)
        if self.to == self.stream and same_store(self.store, self.to_store):
            raise MirrorIntoItself(self.stream, self.store)

    def command_line(self, run: RunOptions = SERVICE) -> list[str]:
        """The `sluice run mirror …` argv that runs exactly this spec."""
        flags = ["--stream", self.stream, "--to", self.to, "--to-store", self.to_store]
        if self.fixed_routing_key is not None:
            # `--fixed-routing-key=-x`: a separate `-x` would be taken for an option
            flags.append(f"--fixed-routing-key={self.fixed_routing_key}")
        if self.commit_mode != "auto":
            flags += ["--commit-mode", self.commit_mode]
        return sluice_run(self.store, "mirror", flags, run)


class MirrorIntoItself(SluiceError, ValueError):
    """A mirror whose target is its own source stream."""

    def __init__(self, stream: str, store: str) -> None:
        self.stream, self.store = stream, store
        msg = (
            f"mirror {stream} -> {stream} in {store}: a stream cannot be mirrored into itself "
            "(each batch would copy the copies of the one before: every event again and again); "
            "give --to another stream, or --to-store another store"
        )
        super().__init__(msg)


def mirror_identity(spec: MirrorSpec) -> JobIdentity:
    """What the mirror's checkpoint records (`job.json`): both streams, with their stores."""
    return JobIdentity("mirror", f"{spec.store}#{spec.stream}", f"{spec.to_store}#{spec.to}")


def mirror_checkpoint(spec: MirrorSpec) -> Path:
    """The checkpoint `sluice run mirror` uses without `--checkpoint` (and the assets)."""
    return default_checkpoint(mirror_identity(spec), spec.stream, spec.to)


def mirror_parameters(spec: MirrorSpec) -> JobParameters:
    """What the target's events were copied with: their routing key (`commit_mode` is how
    they are written, not what: it may change between runs)."""
    key = spec.fixed_routing_key
    return JobParameters("mirror", () if key is None else (f"--fixed-routing-key {key}",))


#: Why a mirror's checkpoint refuses another `fixed_routing_key`
KEY_CHANGED = (
    "the events it copied already carry those routing keys, and later ones would carry others "
    "in the same target stream"
)
#: How to mirror with another one
KEY_REMEDY = "give a new --checkpoint and a new --to stream to copy with the new ones"


class TargetTaken(SluiceError, ValueError):
    """A new checkpoint that would copy its source from the head into a target stream that
    already holds events: those of another checkpoint's mirror (or of one since lost)."""

    def __init__(self, spec: MirrorSpec, checkpoint: Path, events: int) -> None:
        self.spec, self.checkpoint, self.events = spec, checkpoint, events
        msg = (
            f"mirror {spec.stream} -> {spec.to}: {spec.to} holds {events:,} events already and "
            f"this run's checkpoint {checkpoint} has copied none: copying {spec.stream} from its "
            "head would write them a second time. Go on with the mirror that wrote them (its "
            f"--checkpoint), start after them (--from tail, or a cut of {spec.stream}), or mirror "
            "into a new --to stream"
        )
        super().__init__(msg)


def check_target_free(spec: MirrorSpec, checkpoint: Checkpoint, starting: str) -> None:
    """Refuse (`TargetTaken`) a checkpoint that has copied nothing yet and starts at the head
    when the target stream holds events: one target stream has one mirror (as one export
    output has one checkpoint), so a second checkpoint, or one made again after its own was
    lost, would copy every event again. A `--from` other than the head is the user saying
    where the copy goes on."""
    if starting.lower() != "head" or not checkpoint.is_new:
        return
    with open_store(spec.to_store) as target:
        events = target.info(spec.to).events
    if events:
        raise TargetTaken(spec, checkpoint.root, events)


def ensure_target(spec: MirrorSpec) -> None:
    """Create the target stream (as many segments as the source) if it does not exist."""
    with open_store(spec.store) as source:
        segments = sum(1 for s in source.info(spec.stream).segments if not s.sealed)
    with open_store(spec.to_store) as target:
        if not target.stream_exists(spec.to):
            target.create_stream(spec.to, segments=max(1, segments))


def mirror(
    spark: SparkSession | SessionFactory,
    spec: MirrorSpec,
    run: RunOptions,
    report: Callable[[BatchReport], None] = lambda _: None,
) -> JobSummary:
    """Run the mirror until caught up (`available-now`) or until stopped (`continuous`)."""
    identity = mirror_identity(spec)
    root = run.checkpoint or mirror_checkpoint(spec)
    ensure_target(spec)

    def options(checkpoint: Checkpoint) -> dict[str, str]:
        opts = {
            "store": spec.to_store,
            "stream": spec.to,
            "state": str(checkpoint.ledger_path),
            "commitMode": spec.commit_mode,
        }
        if spec.fixed_routing_key is not None:
            opts["routingKey"] = spec.fixed_routing_key
        return opts

    def sink(events: DataFrame, checkpoint: Checkpoint) -> DataStreamWriter:
        return (
            events.writeStream.format("sluice")
            .options(**options(checkpoint))
            .queryName(f"mirror {spec.stream} -> {spec.to}")
        )

    with Checkpoint(root, identity) as checkpoint:
        has_output = not checkpoint.is_new
        wanted = mirror_parameters(spec)
        checkpoint.check_parameters(
            wanted, has_output=has_output, why=KEY_CHANGED, remedy=KEY_REMEDY
        )
        checkpoint.note_start(run.starting)
        check_target_free(spec, checkpoint, run.starting)
        # Range rows: each task copies its range from the source store itself.
        source = JobSource(spec.store, spec.stream, emit="ranges")
        small = stream_writer_batch("sluice", options(checkpoint))
        batches = run_query(
            spark, checkpoint, source, run=run, sink=sink, report=report, in_process=small
        )
        return JobSummary("mirror", str(checkpoint.root), batches, {"stream": spec.to})
