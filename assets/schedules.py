"""The nightly replay schedule: re-run the replays whose model changed since they ran.

A replay asset's code version is its model's code version; each materialization records the
version it ran with (the `dagster/code_version` tag). The schedule requests, per family, one
run for every slice partition where some model's latest replay ran another version (or never
ran): after a change to a model's code, its replays are stale in the UI until this runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from assets.keys import CODE_VERSION_TAG, nightly_schedule_name, replay_job_name, slice_partitions
from pipeline.settings import DagsterTable, StreamFamily


def recorded_version(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> str | None:
    """The code version the latest materialization of `key` / `partition` ran with."""
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    )
    if not found.records:
        return None
    materialization = found.records[0].asset_materialization
    return materialization.tags.get(CODE_VERSION_TAG) if materialization else None


def stale_partitions(
    instance: dg.DagsterInstance, family: StreamFamily, versions: dict[dg.AssetKey, str]
) -> list[str]:
    """Slice partitions where a replay asset's recorded version is not its current one."""
    partitions = instance.get_dynamic_partitions(slice_partitions(family).name)
    return [
        p
        for p in partitions
        if any(recorded_version(instance, key, p) != v for key, v in versions.items())
    ]


def evaluate_nightly(
    context: dg.ScheduleEvaluationContext, family: StreamFamily, versions: dict[dg.AssetKey, str]
) -> list[dg.RunRequest] | dg.SkipReason:
    stale = stale_partitions(context.instance, family, versions)
    if not stale:
        return dg.SkipReason(f"every replay of {family.name} ran its model's current version")
    # One run per slice and set of model versions, ever: a tick that finds the same work
    # still queued or failing does not pile up duplicates.
    target = ",".join(f"{k.to_user_string()}@{v}" for k, v in sorted(versions.items()))
    return [
        dg.RunRequest(
            run_key=f"nightly:{p}:{target}", partition_key=p, job_name=replay_job_name(family)
        )
        for p in stale
    ]


def nightly_replays(
    family: StreamFamily,
    job: dg.UnresolvedAssetJobDefinition,
    replays: Sequence[dg.AssetsDefinition],
    table: DagsterTable,
) -> dg.ScheduleDefinition:
    """The nightly schedule of the family's replay `job`, at `[dagster] replay_schedule`."""
    versions = {replay.key: replay.code_versions_by_key[replay.key] for replay in replays}

    @dg.schedule(
        name=nightly_schedule_name(family),
        cron_schedule=table.replay_schedule,
        job=job,
        execution_timezone=table.timezone,
        description=f"Replays the slices of {family.name} whose model changed.",
    )
    def _nightly(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
        return evaluate_nightly(context, family, versions)

    return _nightly
