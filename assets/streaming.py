"""The mirror and the exports of a family: Dagster runs that catch up to the tail.

Each asset runs its job with `Trigger.AvailableNow` on the job's default checkpoint — the same
directory a `sluice run … --continuous` service uses (`service_command` prints its command
line) — so both ways of running share one position and never run at once: the checkpoint's
lock refuses the second (`CheckpointInUse`). A Dagster run that finds the service running
says so (a warning and an observation on the asset) and skips; the service's progress becomes
materializations through the `streaming_service_progress` sensor (`assets/services.py`).

Every step also declares a concurrency pool named after its job and family (one slot each,
see `assets/instance.py`), so two Dagster runs of one streaming step wait for each other
instead of failing on the lock.

Delivery: the jobs are exactly-once (`pipeline/jobs/mirror.py`, `export.py`); a Dagster run
that fails mid-way is re-run from the same checkpoint and publishes each batch once.
"""

import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster import AssetExecutionContext

from assets.cuts import END_CUT, cut_range_metadata
from assets.edge import edge_key
from pipeline.jobs.checkpoint import (
    BatchTotals,
    CheckpointInUse,
    CheckpointProgress,
    default_checkpoint,
    ledger_totals,
)
from pipeline.jobs.checkpoint import committed_progress as read_progress
from pipeline.jobs.export import ExportSpec, export
from pipeline.jobs.mirror import MirrorSpec, mirror
from pipeline.jobs.runner import BatchReport, JobSummary, RunOptions
from pipeline.settings import StreamFamily
from pipeline.streams import StreamCut
from resources.spark import SparkResource
from resources.stores import StreamStoresResource

SKIPPED = "skipped"


def mirror_key(family: StreamFamily) -> dg.AssetKey:
    return dg.AssetKey([family.name, "cloud_mirror"])


def export_key(family: StreamFamily, fmt: str) -> dg.AssetKey:
    return dg.AssetKey([family.name, f"{fmt}_export"])


#: Spark steps are exactly-once (mirror, export, slices) or deterministic (replays), so a step
#: that failed for a transient reason (a Python worker that did not connect back on a loaded
#: machine, a lost executor) is safe to run again from its checkpoint.
SPARK_RETRY = dg.RetryPolicy(max_retries=2, delay=5)


def pool(job: str, family: StreamFamily) -> str:
    """The concurrency pool of `job` for `family` (one slot: see assets/instance.py)."""
    return f"sluice_{job}_{family.name}"


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

    def checkpoint(self, job: str) -> Path:
        """The checkpoint `sluice run <job>` uses by default (shared with the service)."""
        if job == "mirror":
            return default_checkpoint("mirror", self.mirror.stream, self.mirror.to)
        return default_checkpoint("export", self.export.stream, str(self.export.output))


def service_command(spec: MirrorSpec | ExportSpec) -> str:
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
            f"service (`{service}`), whose progress the streaming_service_progress sensor "
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


def run_metadata(
    outcome: StepOutcome, checkpoint: Path, source_tail: StreamCut
) -> tuple[dict[str, Any], StreamCut | None]:
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
        metadata["last_batch"] = dg.MetadataValue.int(summary.batches[-1].batch_id)
    return metadata, end


def mirror_metadata(
    outcome: StepOutcome, checkpoint: Path, source_tail: StreamCut, target: str
) -> dict[str, Any]:
    metadata, _ = run_metadata(outcome, checkpoint, source_tail)
    metadata["target_stream"] = dg.MetadataValue.text(target)
    return metadata


def data_version(metadata: dict[str, Any]) -> dg.DataVersion | None:
    end = metadata.get(END_CUT)
    return dg.DataVersion(end.value) if end is not None else None


# --- the assets ---------------------------------------------------------------------------


def mirror_asset(family: StreamFamily, jobs: FamilyJobs) -> dg.AssetsDefinition:
    """`<family>/cloud_mirror`: the edge stream mirrored into the cloud store, exactly once."""
    key, checkpoint = mirror_key(family), jobs.checkpoint("mirror")
    service = service_command(jobs.mirror)

    @dg.asset(
        key=key,
        deps=[edge_key(family)],
        group_name=family.name,
        kinds={"spark", "sluice"},
        pool=pool("mirror", family),
        retry_policy=SPARK_RETRY,
        output_required=False,
        description=f"{family.stream} mirrored into {family.mirror_stream} (store "
        f"`{family.mirror_store}`), exactly once. Runs until caught up; or run it as a "
        f"service: `{service}`",
        metadata={"stream": family.mirror_stream, "service_command": service},
    )
    def _mirror(
        context: AssetExecutionContext, spark: SparkResource, stores: StreamStoresResource
    ) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
        outcome = catch_up(
            context,
            lambda run, report: mirror(spark.session, jobs.mirror, run, report),
            checkpoint,
            service,
        )
        if outcome.skipped:
            yield skipped_observation(key, outcome)
            return
        tail = stores.open(family.store).tail(family.stream)
        metadata = mirror_metadata(outcome, checkpoint, tail, family.mirror_stream)
        yield dg.MaterializeResult(metadata=metadata, data_version=data_version(metadata))

    return _mirror


def column_schema(columns: list[dict[str, Any]]) -> dg.TableSchema:
    """The flattened schema the export wrote (`ExportSpec` outputs' `columns`)."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=c["name"],
                type=c["type"],
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


def export_metadata(
    outcome: StepOutcome, checkpoint: Path, source_tail: StreamCut, output: Path, fmt: str
) -> dict[str, Any]:
    metadata, _ = run_metadata(outcome, checkpoint, source_tail)
    summary, totals = outcome.summary, outcome.totals
    assert summary is not None
    mine = [output / f for f in totals.files if f.startswith(f"{fmt}/")]
    rate = summary.quarantined / summary.events if summary.events else 0.0
    metadata.update(
        {
            "rows": dg.MetadataValue.int(summary.rows),
            "quarantined": dg.MetadataValue.int(summary.quarantined),
            "quarantine_rate": dg.MetadataValue.float(rate),
            "bytes": dg.MetadataValue.int(sum(p.stat().st_size for p in mine if p.exists())),
            "files": dg.MetadataValue.int(len(mine)),
            "output": dg.MetadataValue.path(str(output / fmt)),
            "quarantine_table": dg.MetadataValue.path(str(output / "_quarantine")),
            "dagster/column_schema": column_schema(summary.outputs.get("columns", [])),
        }
    )
    for name in ("min_event_time_ns", "max_event_time_ns"):
        if getattr(totals, name) is not None:
            metadata[name] = dg.MetadataValue.int(getattr(totals, name))
    if fmt == "parquet":
        metadata["dagster/row_count"] = dg.MetadataValue.int(parquet_row_count(output / fmt))
    return metadata


def export_assets(family: StreamFamily, jobs: FamilyJobs) -> dg.AssetsDefinition:
    """`<family>/<format>_export`: the mirror flattened into hive-partitioned files."""
    checkpoint, output = jobs.checkpoint("export"), jobs.export.output
    service = service_command(jobs.export)
    specs = [
        dg.AssetSpec(
            key=export_key(family, fmt),
            deps=[mirror_key(family)],
            group_name=family.name,
            kinds={"spark", fmt},
            skippable=True,
            description=f"{family.mirror_stream} flattened through {family.schema} into "
            f"{fmt.upper()} under {output / fmt}, partitioned by date and hour, with lineage "
            f"columns _segment, _offset, _sample; bad events go to {output / '_quarantine'}.",
            metadata={"output": dg.MetadataValue.path(str(output / fmt))},
        )
        for fmt in jobs.export.formats
    ]

    @dg.multi_asset(
        specs=specs,
        name=f"export_{family.name}",
        pool=pool("export", family),
        retry_policy=SPARK_RETRY,
        can_subset=False,
        description=f"Export {family.mirror_stream}; or run it as a service: `{service}`",
    )
    def _export(
        context: AssetExecutionContext, spark: SparkResource, stores: StreamStoresResource
    ) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
        outcome = catch_up(
            context,
            lambda run, report: export(spark.session, jobs.export, run, report),
            checkpoint,
            service,
        )
        if outcome.skipped:
            for spec in specs:
                yield skipped_observation(spec.key, outcome)
            return
        tail = stores.open(family.mirror_store).tail(family.mirror_stream)
        for fmt in jobs.export.formats:
            metadata = export_metadata(outcome, checkpoint, tail, output, fmt)
            yield dg.MaterializeResult(
                asset_key=export_key(family, fmt),
                metadata=metadata,
                data_version=data_version(metadata),
            )

    return _export
