"""The catch-up assets: a streaming job that Dagster runs until caught up with its source.

`catch_up_asset` makes one from a `CatchUpStep` (the mirror and the exports here, the slices
in `assets/slices.py`): it runs the job with `Trigger.AvailableNow` on the checkpoint of its
`sluice run … --continuous` service, skips with an observation while that service holds it,
retries transient Spark failures, and records the cut range, counts and lag it covered. A run
that finds nothing new (decided from the checkpoint and the store, `pipeline/jobs/runner.py`:
`caught_up`) records an observation without ever starting Spark.
Delivery: exactly-once, as the jobs are (`pipeline/jobs/mirror.py`, `export.py`,
`bookmark.py`): a failed run re-runs from its checkpoint. More in `assets/DESIGN.md`.
"""

import shlex
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, NotRequired, TypedDict, TypeVar, cast

import dagster as dg
from dagster import AssetExecutionContext

from assets.cuts import cut_range_metadata
from assets.keys import (
    END_CUT,
    LAST_BATCH,
    SERVICE_PROGRESS_SENSOR,
    SKIPPED,
    ExportFormat,
    StreamingJob,
    catch_up_op,
    edge_key,
    export_key,
    mirror_key,
    pool,
)
from pipeline.errors import SluiceError
from pipeline.jobs.bookmark import BookmarkSpec
from pipeline.jobs.checkpoint import (
    BatchTotals,
    CheckpointInUse,
    CheckpointProgress,
    ledger_totals,
)
from pipeline.jobs.checkpoint import committed_progress as read_progress
from pipeline.jobs.export import ExportSpec, export, export_checkpoint
from pipeline.jobs.mirror import MirrorSpec, mirror, mirror_checkpoint
from pipeline.jobs.replay import ReplayError
from pipeline.jobs.runner import BatchReport, JobSummary, RunOptions
from pipeline.outputs import OutputNotWritable
from pipeline.schemas import flatten_plan, quarantine_columns
from pipeline.settings import StreamFamily
from pipeline.streams import StreamCut, StreamStore
from resources.spark import SparkResource
from resources.stores import StreamStoresResource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.jobs.runner import SessionFactory

#: Spark steps are exactly-once (mirror, export, slices) or deterministic (replays), so a step
#: that failed for a transient reason (a Python worker that did not connect back on a loaded
#: machine, a lost executor) is safe to run again from its checkpoint.
SPARK_RETRY = dg.RetryPolicy(max_retries=2, delay=5)

#: What a retry cannot mend: a stream, slice or store name that is not there, input or
#: settings that do not fit (Sluice's `LookupError`s and `ValueError`s), a model that fails
#: (`ReplayError`), a place that cannot be written.
PERMANENT = (LookupError, ValueError, ReplayError, OutputNotWritable)


@contextmanager
def refusing_permanent_errors() -> Iterator[None]:
    """Fail the step at once, with Sluice's one-line message, on an error that `SPARK_RETRY`
    would only repeat (a slice deleted since its partition was added fails three times,
    ten seconds apart, and ends as "Exceeded max_retries"); other errors are retried."""
    try:
        yield
    except SluiceError as exc:
        if not isinstance(exc, PERMANENT):
            raise
        raise dg.Failure(description=str(exc), allow_retries=False) from None


@dataclass(frozen=True, slots=True)
class FamilyJobs:
    """The two streaming jobs of a family, with the stores resolved to URIs."""

    mirror: MirrorSpec
    export: ExportSpec

    @classmethod
    def of(
        cls, family: StreamFamily, stores: dict[str, str], formats: tuple[str, ...]
    ) -> "FamilyJobs":
        cloud = stores[family.mirror_store]
        return cls(
            mirror=MirrorSpec(
                stream=family.stream,
                to=family.mirror_stream,
                store=stores[family.store],
                to_store=cloud,
                fixed_routing_key=family.mirror_routing_key,
            ),
            export=ExportSpec(
                stream=family.mirror_stream,
                schema=family.schema,
                output=family.export_dir.absolute(),
                store=cloud,
                formats=formats,
            ),
        )

    def checkpoint(self, job: Literal["mirror", "export"]) -> Path:
        """The checkpoint `sluice run <job>` uses by default (shared with the service)."""
        return mirror_checkpoint(self.mirror) if job == "mirror" else export_checkpoint(self.export)


def service_command(spec: MirrorSpec | ExportSpec | BookmarkSpec) -> str:
    """The `sluice run … --continuous` command of the service that shares the checkpoint."""
    return shlex.join(spec.command_line())


# --- running a job and describing what it did -------------------------------------------


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one catch-up run did, or why it skipped."""

    summary: JobSummary | None
    skipped: str | None
    position: CheckpointProgress | None
    totals: BatchTotals


def catch_up(
    context: dg.AssetExecutionContext,
    run: Callable[[RunOptions, Callable[[BatchReport], None]], JobSummary],
    checkpoint: Path,
    service: str,
) -> StepOutcome:
    """Run `run` until caught up; a checkpoint held by a running service means skip."""
    try:
        summary = run(RunOptions(mode="available-now"), lambda b: context.log.info(b.line()))
    except CheckpointInUse as exc:
        why = (
            f"skipped: the checkpoint is held by another run ({exc.holder}): the continuous "
            f"service (`{service}`), whose progress the {SERVICE_PROGRESS_SENSOR} sensor "
            "records, or another run of this job that is catching up right now"
        )
        context.log.warning(why)
        return StepOutcome(None, why, read_progress(checkpoint), BatchTotals())
    ids = [b.batch_id for b in summary.batches]
    totals = ledger_totals(checkpoint, min(ids) - 1, max(ids)) if ids else BatchTotals()
    return StepOutcome(summary, None, read_progress(checkpoint), totals)


def skipped_observation(key: dg.AssetKey, outcome: StepOutcome) -> dg.AssetObservation:
    metadata: dict[str, Any] = {SKIPPED: dg.MetadataValue.text(outcome.skipped or "")}
    if outcome.position is not None:
        metadata["checkpoint_end_cut"] = dg.MetadataValue.text(outcome.position.end_cut.text)
    return dg.AssetObservation(asset_key=key, metadata=metadata)


#: Whether a catch-up run started Spark: false when the checkpoint and the store showed that
#: nothing was new, which is decided before any session exists, or when its small backlog ran
#: in the step's own process.
SPARK_STARTED = "spark_started"


def idle_observation(
    key: dg.AssetKey, metadata: dict[str, Any], spark_started: bool
) -> dg.AssetObservation:
    """A run that found no new events: an observation (why, where the job stands, the lag,
    whether Spark had to start to find out), never a materialization, so the latest
    materialization always describes real data."""
    end = metadata.get(END_CUT)
    why = f"no new events since {end.value}" if end is not None else "no events yet"
    kept = {k: metadata[k] for k in (END_CUT, "lag_bytes", "checkpoint") if k in metadata}
    metadata = {SKIPPED: dg.MetadataValue.text(why), **kept}
    metadata[SPARK_STARTED] = dg.MetadataValue.bool(spark_started)
    return dg.AssetObservation(asset_key=key, metadata=metadata)


def run_metadata(outcome: StepOutcome, checkpoint: Path, source_tail: StreamCut) -> dict[str, Any]:
    """Cut range, counts and lag of a finished run (an idle run covers an empty range)."""
    summary, position = outcome.summary, outcome.position
    assert summary is not None
    end = StreamCut.parse(summary.end_cut) if summary.end_cut else None
    if end is None and position is not None:
        end = position.end_cut
    metadata: dict[str, Any] = {
        "events": dg.MetadataValue.int(summary.events),
        "batches": dg.MetadataValue.int(len(summary.batches)),
        "bytes": dg.MetadataValue.int(outcome.totals.bytes),
        "checkpoint": dg.MetadataValue.path(str(checkpoint)),
    }
    if end is not None:
        start = summary.start_cut if summary.batches else end.text
        metadata.update(cut_range_metadata(start, end))
        metadata["lag_bytes"] = dg.MetadataValue.int(end.bytes_until(source_tail))
    if summary.batches:
        metadata[LAST_BATCH] = dg.MetadataValue.int(summary.batches[-1].batch_id)
        # false when a small backlog ran in the step's own process (`in_process.py`)
        spark = any(batch.spark for batch in summary.batches)
        metadata[SPARK_STARTED] = dg.MetadataValue.bool(spark)
    return metadata


def data_version(metadata: dict[str, Any]) -> dg.DataVersion | None:
    end = metadata.get(END_CUT)
    return dg.DataVersion(end.value) if end is not None else None


# --- the factory --------------------------------------------------------------------------

#: What the step reads before its job runs, for its results to compare against.
Before = TypeVar("Before")
#: A streaming job run with the step's Spark session, which it asks for only when it needs one
#: (`SessionFactory`): `mirror`, `export`, `bookmark`.
RunJob = Callable[["SessionFactory", RunOptions, Callable[[BatchReport], None]], JobSummary]


class StepSession:
    """The Spark session of one step, built on the job's first call (never, for a run that
    finds nothing new); `started` says whether it was asked for."""

    def __init__(self, spark: SparkResource) -> None:
        self.spark, self.started = spark, False

    def __call__(self) -> "SparkSession":
        self.started = True
        return self.spark.session


@dataclass(frozen=True, slots=True)
class Source:
    """The stream a job reads (its tail after the run measures the lag), in a named store."""

    store: str
    stream: str


@dataclass(frozen=True, slots=True)
class StepRun(Generic[Before]):
    """A finished catch-up run, as a step's `results` sees it."""

    outcome: StepOutcome
    metadata: dict[str, Any]  # `run_metadata`: what every catch-up materialization records
    store: StreamStore  # the source's store, open
    before: Before


def nothing_before(store: StreamStore) -> None:
    """A step whose results need nothing read before the run."""


@dataclass(frozen=True, slots=True)
class CatchUpStep(Generic[Before]):
    """What differs between the catch-up assets; `catch_up_asset` adds what they share (the
    pool, the retry policy, skipping for a running service, the metadata of a run)."""

    job: StreamingJob
    family: StreamFamily
    specs: tuple[dg.AssetSpec, ...]
    description: str
    checkpoint: Path
    service: str  # the command line of the continuous service on the same checkpoint
    source: Source
    run: RunJob
    results: Callable[[StepRun[Before]], Iterator[dg.MaterializeResult]]
    #: reads what `results` compares with, before the job runs (the slices: those recorded)
    before: Callable[[StreamStore], Before] = nothing_before

    @property
    def keys(self) -> tuple[dg.AssetKey, ...]:
        return tuple(spec.key for spec in self.specs)


def spark_asset_spec(
    key: dg.AssetKey,
    family: StreamFamily,
    *,
    deps: Sequence[dg.AssetKey],
    kind: str,
    description: str,
    metadata: dict[str, Any],
) -> dg.AssetSpec:
    """An asset of `family` that a Spark step materializes, or skips."""
    return dg.AssetSpec(
        key=key,
        deps=deps,
        group_name=family.name,
        kinds={"spark", kind},
        skippable=True,
        description=description,
        metadata=metadata,
    )


def job_stores(step: CatchUpStep[Any]) -> dict[str, str]:
    """The stores the step's job reads and writes (name -> URI), as sluice.toml gave them
    when the definitions were built: the job, its checkpoint and its service use these."""
    family = step.family
    used = {family.mirror_store: family.mirror_store_uri}
    if step.job == "mirror":
        used[family.store] = family.store_uri
    return used


def check_stores_config(step: CatchUpStep[Any], stores: StreamStoresResource) -> None:
    """Refuse a `stores` resource (run config from the launchpad) that names other stores
    than the step's job uses: the job would run on sluice.toml's stores while the run's lag,
    counts and slices were read from the configured ones."""
    for name, uri in sorted(job_stores(step).items()):
        configured = stores.uris.get(name)
        if configured == uri:
            continue
        given = "has no" if configured is None else f"sets {configured!r} as"
        msg = (
            f"the stores resource's run config {given} stores.uris.{name}, but the "
            f"{step.job} of {step.family.name} uses {uri!r} ([stores.{name}] of sluice.toml), "
            f"as do its checkpoint and its service: change [stores.{name}] in sluice.toml and "
            "reload the code location, or launch the run without that resource config"
        )
        raise dg.Failure(description=msg, allow_retries=False)


def run_step(
    step: CatchUpStep[Any],
    context: AssetExecutionContext,
    spark: SparkResource,
    stores: StreamStoresResource,
) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
    """One catch-up run of `step`: its results, or an observation of why there are none."""
    check_stores_config(step, stores)
    store = stores.open(step.source.store)
    before = step.before(store)
    session = StepSession(spark)
    outcome = catch_up(
        context,
        lambda options, report: step.run(session, options, report),
        step.checkpoint,
        step.service,
    )
    if outcome.skipped:
        for key in step.keys:
            yield skipped_observation(key, outcome)
        return
    metadata = run_metadata(outcome, step.checkpoint, store.tail(step.source.stream))
    if outcome.summary is not None and outcome.summary.events == 0:
        context.log.info(f"nothing to materialize: {step.source.stream} has no new events")
        for key in step.keys:
            yield idle_observation(key, metadata, session.started)
        return
    yield from step.results(StepRun(outcome, metadata, store, before))


def catch_up_asset(step: CatchUpStep[Any]) -> dg.AssetsDefinition:
    """The step's assets, materialized by one run of its job until caught up."""

    @dg.multi_asset(
        specs=step.specs,
        name=catch_up_op(step.job, step.family),
        pool=pool(step.job, step.family),
        retry_policy=SPARK_RETRY,
        can_subset=False,
        description=step.description,
    )
    def _catch_up(
        context: AssetExecutionContext, spark: SparkResource, stores: StreamStoresResource
    ) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
        with refusing_permanent_errors():
            yield from run_step(step, context, spark, stores)

    return _catch_up


# --- the mirror and the exports -----------------------------------------------------------


def mirror_step(family: StreamFamily, jobs: FamilyJobs) -> CatchUpStep[None]:
    """`<family>/cloud_mirror`: the edge stream mirrored into the cloud store, exactly once."""
    service = service_command(jobs.mirror)
    description = (
        f"{family.stream} mirrored into {family.mirror_stream} (store "
        f"`{family.mirror_store}`), exactly once. Runs until caught up; or run it as a "
        f"service: `{service}`"
    )
    spec = spark_asset_spec(
        mirror_key(family),
        family,
        deps=[edge_key(family)],
        kind="sluice",
        description=description,
        metadata={"stream": family.mirror_stream, "service_command": service},
    )

    def results(run: StepRun[None]) -> Iterator[dg.MaterializeResult]:
        target = dg.MetadataValue.text(family.mirror_stream)
        metadata = {**run.metadata, "target_stream": target}
        yield dg.MaterializeResult(
            asset_key=spec.key, metadata=metadata, data_version=data_version(metadata)
        )

    return CatchUpStep(
        job="mirror",
        family=family,
        specs=(spec,),
        description=description,
        checkpoint=jobs.checkpoint("mirror"),
        service=service,
        source=Source(family.store, family.stream),
        run=lambda spark, options, report: mirror(spark, jobs.mirror, options, report),
        results=results,
    )


class Column(TypedDict):
    """A column of a flattened schema, as a job's summary reports it (`FlattenPlan.describe`;
    `description` is the Avro field's `doc`)."""

    name: str
    type: str
    nullable: bool
    description: NotRequired[str]


def column_schema(columns: Sequence[Column]) -> dg.TableSchema:
    """The flattened schema a job wrote (the export: its summary's `outputs["columns"]`)."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=c["name"],
                type=c["type"],
                description=c.get("description") or None,
                constraints=dg.TableColumnConstraints(nullable=bool(c["nullable"])),
            )
            for c in columns
        ]
    )


def parquet_row_count(folder: Path) -> int:
    """Rows of every published Parquet file under `folder` (reads only the footers)."""
    import pyarrow.dataset as ds

    files = sorted(str(p) for p in folder.glob("date=*/hour=*/*.parquet"))
    return ds.dataset(files, format="parquet").count_rows() if files else 0


def export_metadata(outcome: StepOutcome, output: Path, fmt: ExportFormat) -> dict[str, Any]:
    """What an export run wrote in `fmt`, beyond what every catch-up run records."""
    summary, totals = outcome.summary, outcome.totals
    assert summary is not None
    mine = [output / f for f in totals.files if f.startswith(f"{fmt}/")]
    rate = summary.quarantined / summary.events if summary.events else 0.0
    metadata: dict[str, Any] = {
        "rows": dg.MetadataValue.int(summary.rows),
        "quarantined": dg.MetadataValue.int(summary.quarantined),
        "quarantine_rate": dg.MetadataValue.float(rate),
        "bytes": dg.MetadataValue.int(sum(p.stat().st_size for p in mine if p.exists())),
        "files": dg.MetadataValue.int(len(mine)),
        "output": dg.MetadataValue.path(str(output / fmt)),
        "quarantine_table": dg.MetadataValue.path(str(output / "_quarantine")),
        "quarantine_schema": column_schema(quarantine_columns()),
        "dagster/column_schema": column_schema(summary.outputs.get("columns", [])),
    }
    for name in ("min_event_time_ns", "max_event_time_ns"):
        if getattr(totals, name) is not None:
            metadata[name] = dg.MetadataValue.int(getattr(totals, name))
    if fmt == "parquet":
        metadata["dagster/row_count"] = dg.MetadataValue.int(parquet_row_count(output / fmt))
    return metadata


def export_step(family: StreamFamily, jobs: FamilyJobs) -> CatchUpStep[None]:
    """`<family>/<format>_export`: the mirror flattened into hive-partitioned files."""
    output, service = jobs.export.output, service_command(jobs.export)
    formats = cast(tuple[ExportFormat, ...], jobs.export.formats)  # settings refuse others
    plan = flatten_plan(family.schema)
    specs = tuple(
        spark_asset_spec(
            export_key(family, fmt),
            family,
            deps=[mirror_key(family)],
            kind=fmt,
            description=f"{family.mirror_stream} flattened through {family.schema} into "
            f"{fmt.upper()} under {output / fmt}, partitioned by date and hour, with lineage "
            f"columns _segment, _offset, _sample; bad events go to {output / '_quarantine'}.",
            metadata={
                "output": dg.MetadataValue.path(str(output / fmt)),
                "dagster/column_schema": column_schema(plan.describe()),
            },
        )
        for fmt in formats
    )

    def results(run: StepRun[None]) -> Iterator[dg.MaterializeResult]:
        for fmt in formats:
            metadata = {**run.metadata, **export_metadata(run.outcome, output, fmt)}
            yield dg.MaterializeResult(
                asset_key=export_key(family, fmt),
                metadata=metadata,
                data_version=data_version(metadata),
            )

    return CatchUpStep(
        job="export",
        family=family,
        specs=specs,
        description=f"Export {family.mirror_stream}; or run it as a service: `{service}`",
        checkpoint=jobs.checkpoint("export"),
        service=service,
        source=Source(family.mirror_store, family.mirror_stream),
        run=lambda spark, options, report: export(spark, jobs.export, options, report),
        results=results,
    )
