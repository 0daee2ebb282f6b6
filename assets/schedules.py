"""The nightly replay schedule: replay what is stale, else revalidate the oldest replay.

A replay asset's code version is its model's version and parameters; each materialization
records the version it ran with (the `dagster/code_version` tag). Per family, a tick requests
one run for every slice partition where some model's latest replay ran another version or
never ran: after a change to a model's code, its replays are stale in the UI until this runs.
When nothing is stale, it revalidates the slice checked longest ago: the run reads the slice
again between its cuts (the stream must still hold them, every block's checksum intact), runs
the current model over it and checks that a second replay gives the same bytes. A slice whose
revalidation fails is tried again in its next turn, after the others.
Slices with a replay run queued or running (the new-slices sensor's) are left to that run.
Every run says why in its tags (`sluice/replay_reason`, `sluice/revalidates`).
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg
from dagster._check import CheckError

from assets.keys import (
    CODE_VERSION_TAG,
    PARTITION_TAG,
    REPLAY_REASON_TAG,
    REVALIDATES_TAG,
    nightly_schedule_name,
    replay_job_name,
    slice_partitions,
)
from assets.sensors import UNFINISHED
from pipeline.settings import DagsterTable, StreamFamily


def latest_replay(
    instance: dg.DagsterInstance, key: dg.AssetKey, partition: str
) -> dg.EventLogRecord | None:
    """The latest materialization of `key` / `partition`, if any."""
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    )
    return found.records[0] if found.records else None


def recorded_version(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str) -> str | None:
    """The code version the latest materialization of `key` / `partition` ran with."""
    record = latest_replay(instance, key, partition)
    materialization = record.asset_materialization if record else None
    return materialization.tags.get(CODE_VERSION_TAG) if materialization else None


def partitions_in_flight(instance: dg.DagsterInstance, family: StreamFamily) -> set[str]:
    """Slice partitions that a queued or running replay run of `family` is about to replay."""
    runs = instance.get_run_records(
        dg.RunsFilter(job_name=replay_job_name(family), statuses=UNFINISHED)
    )
    return {p for r in runs if (p := r.dagster_run.tags.get(PARTITION_TAG)) is not None}


def stale_partitions(
    instance: dg.DagsterInstance, family: StreamFamily, versions: dict[dg.AssetKey, str]
) -> list[str]:
    """Slice partitions where a replay asset's recorded version is not its current one, and
    that no unfinished run is replaying already."""
    partitions = instance.get_dynamic_partitions(slice_partitions(family).name)
    busy = partitions_in_flight(instance, family)
    return [
        p
        for p in partitions
        if p not in busy
        and any(recorded_version(instance, key, p) != v for key, v in versions.items())
    ]


def revalidations_tried(instance: dg.DagsterInstance, family: StreamFamily) -> dict[str, float]:
    """When each slice partition's latest revalidation run was created (epoch seconds),
    whatever became of it."""
    runs = instance.get_run_records(
        dg.RunsFilter(job_name=replay_job_name(family), tags={REPLAY_REASON_TAG: "revalidate"})
    )
    tried: dict[str, float] = {}
    for r in runs:
        if (p := r.dagster_run.tags.get(PARTITION_TAG)) is not None:
            tried[p] = max(tried.get(p, 0.0), r.create_timestamp.timestamp())
    return tried


def oldest_replay(
    instance: dg.DagsterInstance, family: StreamFamily, keys: Sequence[dg.AssetKey]
) -> tuple[str, dg.EventLogRecord] | None:
    """The partition checked longest ago (not in flight), with its oldest model replay's
    record; None when no slice has been replayed by every model. A partition was checked when
    its oldest model replay was recorded or when a revalidation of it was last tried, if later:
    a slice whose history no longer replays fails its turn and goes to the back of the line,
    instead of taking every night's turn from the slices behind it."""
    busy = partitions_in_flight(instance, family)
    tried = revalidations_tried(instance, family)
    oldest: tuple[tuple[float, int], str, dg.EventLogRecord] | None = None
    for partition in instance.get_dynamic_partitions(slice_partitions(family).name):
        if partition in busy:
            continue
        records = [latest_replay(instance, key, partition) for key in keys]
        if not records or any(r is None for r in records):
            continue
        first = min((r for r in records if r is not None), key=lambda r: r.storage_id)
        checked = (max(first.timestamp, tried.get(partition, 0.0)), first.storage_id)
        if oldest is None or checked < oldest[0]:
            oldest = (checked, partition, first)
    return (oldest[1], oldest[2]) if oldest is not None else None


def tick_text(context: dg.ScheduleEvaluationContext) -> str | None:
    """The tick's scheduled time; None when the schedule is evaluated by hand (a test)."""
    try:
        return context.scheduled_execution_time.isoformat()
    except CheckError:  # the context has no scheduled time
        return None


def evaluate_nightly(
    context: dg.ScheduleEvaluationContext, family: StreamFamily, versions: dict[dg.AssetKey, str]
) -> list[dg.RunRequest] | dg.SkipReason:
    job = replay_job_name(family)
    stale = stale_partitions(context.instance, family, versions)
    if stale:
        # One run per slice and set of model versions, ever: a tick that finds the same work
        # still failing does not pile up duplicates.
        target = ",".join(f"{k.to_user_string()}@{v}" for k, v in sorted(versions.items()))
        return [
            dg.RunRequest(
                run_key=f"nightly:{p}:{target}",
                partition_key=p,
                job_name=job,
                tags={REPLAY_REASON_TAG: "stale"},
            )
            for p in stale
        ]
    oldest = oldest_replay(context.instance, family, sorted(versions))
    if oldest is None:
        return dg.SkipReason(f"{family.name} has no replayed slice to revalidate yet")
    partition, record = oldest
    # One revalidation per tick: a slice whose history no longer replays fails every night.
    return [
        dg.RunRequest(
            run_key=f"revalidate:{partition}:{tick_text(context) or record.storage_id}",
            partition_key=partition,
            job_name=job,
            tags={REPLAY_REASON_TAG: "revalidate", REVALIDATES_TAG: record.run_id},
        )
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
        description=f"Replays the slices of {family.name} whose model changed; when none did, "
        "replays the slice replayed longest ago again, to check that its history still "
        "replays and gives the same results.",
    )
    def _nightly(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
        return evaluate_nightly(context, family, versions)

    return _nightly
