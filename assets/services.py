"""Long-lived services -> materializations: the progress of `sluice run … --continuous`.

A mirror, export or bookmark service advances the checkpoint the family's catch-up assets
also use (`assets/catch_up.py`). This sensor reads each checkpoint
(`pipeline/jobs/checkpoint.py`) and reports the batches committed since the asset's latest
materialization as one materialization, with the metadata a Dagster run records. It leaves
an asset alone while a Dagster run of it is unfinished: that run reports its own batches
(`last_batch`).
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

import dagster as dg

from assets.cuts import cut_range_metadata, metadata_text
from assets.keys import (
    CURSOR_VERSION,
    DATA_VERSION_TAG,
    LAST_BATCH,
    SERVICE_PROGRESS_SENSOR,
    StreamingJob,
)
from assets.sensors import UNFINISHED
from pipeline.jobs.checkpoint import (
    CheckpointError,
    batch_end_cut,
    committed_progress,
    ledger_totals,
    recorded_start,
)
from pipeline.streams import StreamCut


@dataclass(frozen=True, slots=True)
class Watched:
    """A checkpoint whose progress becomes materializations of `keys`."""

    job: StreamingJob
    family: str
    checkpoint: Path
    keys: tuple[dg.AssetKey, ...]


class ServicesCursor(TypedDict):
    """The last batch reported per `<job>/<family>`: shown in the UI; what to report next is
    decided from the assets' latest materializations, not from the cursor."""

    version: Literal[1]
    reported: dict[str, int]


def last_reported_batch(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return -1
    text = metadata_text(event.asset_materialization.metadata, LAST_BATCH)
    return int(text) if text is not None else -1


def running_asset_keys(instance: dg.DagsterInstance) -> set[dg.AssetKey]:
    """Assets that an unfinished Dagster run is about to materialize."""
    keys: set[dg.AssetKey] = set()
    for record in instance.get_run_records(dg.RunsFilter(statuses=UNFINISHED)):
        keys |= set(record.dagster_run.asset_selection or ())
    return keys


def progress_events(
    instance: dg.DagsterInstance, watched: Watched
) -> list[dg.AssetMaterialization]:
    """Materializations for the batches `watched`'s checkpoint committed since the last one."""
    progress = committed_progress(watched.checkpoint)
    if progress is None:
        return []
    after = min(last_reported_batch(instance, key) for key in watched.keys)
    if progress.batch_id <= after:
        return []
    start: StreamCut | str | None = (
        batch_end_cut(watched.checkpoint, after)
        if after >= 0
        else recorded_start(watched.checkpoint)
    )
    totals = ledger_totals(watched.checkpoint, after, progress.batch_id)
    metadata: dict[str, Any] = {
        **cut_range_metadata(start, progress.end_cut),
        "events": dg.MetadataValue.int(totals.events),
        "rows": dg.MetadataValue.int(totals.rows),
        "quarantined": dg.MetadataValue.int(totals.quarantined),
        "bytes": dg.MetadataValue.int(totals.bytes),
        "batches": dg.MetadataValue.int(totals.batches),
        LAST_BATCH: dg.MetadataValue.int(progress.batch_id),
        "checkpoint": dg.MetadataValue.path(str(watched.checkpoint)),
        "reported_by": dg.MetadataValue.text(f"{watched.job} service (checkpoint progress)"),
    }
    return [
        dg.AssetMaterialization(
            asset_key=key,
            metadata=metadata,
            tags={DATA_VERSION_TAG: progress.end_cut.text},
            description=f"progress of the continuous {watched.job} service",
        )
        for key in watched.keys
    ]


def evaluate_services(
    context: dg.SensorEvaluationContext, watched: Sequence[Watched]
) -> dg.SensorResult:
    busy = running_asset_keys(context.instance)
    events: list[dg.AssetMaterialization] = []
    reported: dict[str, int] = {}
    unreadable: list[str] = []
    for item in watched:
        if busy & set(item.keys):
            continue
        try:  # one damaged checkpoint keeps back its own progress, not the others'
            found = progress_events(context.instance, item)
        except CheckpointError as exc:
            unreadable.append(f"{item.job}/{item.family}: {exc}")
            continue
        events += found
        if found:
            reported[f"{item.job}/{item.family}"] = int(found[0].metadata[LAST_BATCH].value)
    if unreadable:
        context.log.warning("; ".join(unreadable))
    cursor = ServicesCursor(version=CURSOR_VERSION, reported=reported)
    text = json.dumps(cursor) if reported else context.cursor
    idle = None if events else "no service committed a batch since the last report"
    why = "; ".join(unreadable) or idle
    return dg.SensorResult(asset_events=events, cursor=text, skip_reason=why)


def services_sensor(watched: Sequence[Watched], interval_seconds: int) -> dg.SensorDefinition:
    watched = tuple(watched)

    @dg.sensor(
        name=SERVICE_PROGRESS_SENSOR,
        minimum_interval_seconds=interval_seconds,
        description="Turns the progress of continuous mirror/export/bookmark services (their "
        "checkpoints) into materializations of the family's assets.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return evaluate_services(context, watched)

    return _sensor
