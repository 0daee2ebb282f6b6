"""Long-lived services -> materializations: the progress of `sluice run … --continuous`.

When the mirror, export or bookmark job of a family runs as a service, it advances the
checkpoint that the family's Dagster assets also use (`assets/streaming.py`). This sensor
reads each checkpoint (`pipeline/jobs/checkpoint.py`) and, for batches committed since the asset's
latest materialization, reports one materialization with their cut range and counts — so the
UI shows the service's progress as it happens, with the same metadata as a Dagster run.

Batches a Dagster run commits are reported by that run (its materialization's `last_batch`),
so the sensor leaves a family's job alone while a Dagster run of that asset is unfinished.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg

from assets.cuts import cut_range_metadata, metadata_text
from assets.sensors import UNFINISHED
from pipeline.jobs.checkpoint import (
    batch_end_cut,
    committed_progress,
    ledger_totals,
    recorded_start,
)
from pipeline.streams import StreamCut


@dataclass(frozen=True, slots=True)
class Watched:
    """A checkpoint whose progress becomes materializations of `keys`."""

    job: str
    family: str
    checkpoint: Path
    keys: tuple[dg.AssetKey, ...]


def last_reported_batch(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    event = instance.get_latest_materialization_event(key)
    if event is None or event.asset_materialization is None:
        return -1
    text = metadata_text(event.asset_materialization.metadata, "last_batch")
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
        "last_batch": dg.MetadataValue.int(progress.batch_id),
        "checkpoint": dg.MetadataValue.path(str(watched.checkpoint)),
        "reported_by": dg.MetadataValue.text(f"{watched.job} service (checkpoint progress)"),
    }
    return [
        dg.AssetMaterialization(
            asset_key=key,
            metadata=metadata,
            tags={"dagster/data_version": progress.end_cut.text},
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
    for item in watched:
        if busy & set(item.keys):
            continue
        found = progress_events(context.instance, item)
        events += found
        if found:
            reported[f"{item.job}/{item.family}"] = int(found[0].metadata["last_batch"].value)
    cursor = json.dumps({"version": 1, "reported": reported}) if reported else context.cursor
    return dg.SensorResult(asset_events=events, cursor=cursor)


def services_sensor(watched: Sequence[Watched], interval_seconds: int) -> dg.SensorDefinition:
    watched = tuple(watched)

    @dg.sensor(
        name="streaming_service_progress",
        minimum_interval_seconds=interval_seconds,
        description="Turns the progress of continuous mirror/export/bookmark services (their "
        "checkpoints) into materializations of the family's assets.",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return evaluate_services(context, watched)

    return _sensor
