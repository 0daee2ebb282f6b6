"""Sensors: the edge tails move -> catch-up runs; new slices -> partitions and replay runs.

Each sensor's decision is a plain function of (cursor, stores, instance) returning a
`SensorResult`, so tests call it through `build_sensor_context` with real stores. Both
cursors are one small versioned JSON document (`TailsCursor`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Literal, TypedDict

import dagster as dg

from assets.edge import stream_info_metadata
from assets.keys import (
    CURSOR_VERSION,
    DATA_VERSION_TAG,
    EDGE_TAIL_SENSOR,
    NEW_SLICES_SENSOR,
    VIEWS_SENSOR,
    catch_up_job_name,
    catch_up_tags,
    edge_key,
    replay_job_name,
    slice_partitions,
)
from pipeline.errors import SluiceError
from pipeline.jobs.slices import list_slices
from pipeline.settings import StreamFamily
from pipeline.streams import StoreUnavailable, StreamNotFound
from resources.stores import StreamStoresResource, UnknownStore

UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


class TailsCursor(TypedDict):
    """Per family, the tail (cut text) a sensor last acted on: the edge stream's for the tail
    sensor (a catch-up run was requested for it), the slices stream's for the slices sensor."""

    version: Literal[1]
    tails: dict[str, str]


class UnreadableCursor(SluiceError, ValueError):
    """A sensor's cursor that is not a `TailsCursor` of this version (edited by hand in the UI,
    or written by another Sluice)."""

    def __init__(self, text: str, reason: str) -> None:
        self.text, self.reason = text, reason
        msg = f"the sensor's cursor {text[:80]!r} {reason}: reset the sensor's cursor in the UI"
        super().__init__(msg)


def read_tails_cursor(text: str | None) -> TailsCursor:
    if not text:
        return TailsCursor(version=CURSOR_VERSION, tails={})
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise UnreadableCursor(text, "is not JSON") from None
    version = data.get("version") if isinstance(data, dict) else None
    if version != CURSOR_VERSION:
        raise UnreadableCursor(text, f"has version {version!r}, not {CURSOR_VERSION}")
    tails = data.get("tails")
    if not isinstance(tails, dict):
        raise UnreadableCursor(text, "has no tails")
    return TailsCursor(version=CURSOR_VERSION, tails=dict(tails))


def has_unfinished_run(instance: dg.DagsterInstance, tags: dict[str, str]) -> bool:
    records = instance.get_run_records(dg.RunsFilter(tags=tags, statuses=UNFINISHED), limit=1)
    return bool(records)


def evaluate_tails(
    context: dg.SensorEvaluationContext,
    stores: StreamStoresResource,
    families: Sequence[StreamFamily],
) -> dg.SensorResult:
    """Observe every edge tail; request a catch-up run for each family whose tail moved.

    A family that already has a catch-up run queued or running gets none (its run will catch
    up to the tail it finds), and its cursor stays, so the next tick asks again.
    """
    cursor = read_tails_cursor(context.cursor)
    observations: list[dg.AssetObservation] = []
    requests: list[dg.RunRequest] = []
    skipped: list[str] = []
    for family in families:
        try:
            info = stores.open(family.store).info(family.stream)
        except StreamNotFound:
            skipped.append(f"{family.name}: {family.stream} does not exist yet")
            continue
        except (StoreUnavailable, UnknownStore) as exc:
            skipped.append(f"{family.name}: {exc}")
            continue
        tail = info.tail.text
        if cursor["tails"].get(family.name) == tail:
            continue
        observations.append(
            dg.AssetObservation(
                asset_key=edge_key(family),
                metadata=stream_info_metadata(info),
                tags={DATA_VERSION_TAG: tail},
            )
        )
        job = catch_up_job_name(family)
        tags = catch_up_tags(family)
        if has_unfinished_run(context.instance, tags):
            skipped.append(f"{family.name}: a {job} run is already queued or running")
            continue
        requests.append(dg.RunRequest(run_key=f"{job}:{tail}", job_name=job, tags=tags))
        cursor["tails"][family.name] = tail
    why = "; ".join(skipped)
    if why:
        context.log.info(why)
    return dg.SensorResult(
        run_requests=requests,
        asset_events=observations,
        cursor=json.dumps(cursor),
        skip_reason=None if requests else why or "no edge tail moved since the last run request",
    )


Evaluate = Callable[
    [dg.SensorEvaluationContext, StreamStoresResource, Sequence[StreamFamily]], dg.SensorResult
]


def store_sensor(
    name: str,
    description: str,
    evaluate: Evaluate,
    *,
    families: Sequence[StreamFamily],
    interval_seconds: int,
    jobs: Sequence[dg.UnresolvedAssetJobDefinition],
) -> dg.SensorDefinition:
    """A sensor whose decision is `evaluate(context, stores, families)`."""
    families = tuple(families)

    @dg.sensor(
        name=name,
        minimum_interval_seconds=interval_seconds,
        jobs=list(jobs),
        description=description,
    )
    def _sensor(
        context: dg.SensorEvaluationContext, stores: StreamStoresResource
    ) -> dg.SensorResult:
        try:
            return evaluate(context, stores, families)
        except UnreadableCursor as exc:
            return dg.SensorResult(skip_reason=str(exc))

    return _sensor


def tail_sensor(
    families: Sequence[StreamFamily],
    interval_seconds: int,
    jobs: Sequence[dg.UnresolvedAssetJobDefinition],
) -> dg.SensorDefinition:
    description = (
        "Observes every edge stream's tail; when it moved, requests that family's catch-up "
        "run (mirror, exports, slices up to the tail)."
    )
    return store_sensor(
        EDGE_TAIL_SENSOR,
        description,
        evaluate_tails,
        families=families,
        interval_seconds=interval_seconds,
        jobs=jobs,
    )


# --- slices -> partitions and replays -----------------------------------------------------


def evaluate_slices(
    context: dg.SensorEvaluationContext,
    stores: StreamStoresResource,
    families: Sequence[StreamFamily],
) -> dg.SensorResult:
    """Add a partition per new slice of each family and request its replays.

    New means: in the slices stream, not yet a partition of the family's replay assets. The
    cursor (the slices stream's tail) only saves listing the stream when nothing was added.
    """
    cursor = read_tails_cursor(context.cursor)
    adds: list[dg.AddDynamicPartitionsRequest] = []
    requests: list[dg.RunRequest] = []
    skipped: list[str] = []
    for family in families:
        table = family.bookmark
        if table is None:
            continue
        try:
            store = stores.open(family.mirror_store)
            if not store.stream_exists(table.slices_stream):
                skipped.append(f"{family.name}: no slices yet ({table.slices_stream})")
                continue
        except (StoreUnavailable, UnknownStore) as exc:
            skipped.append(f"{family.name}: {exc}")
            continue
        tail = store.tail(table.slices_stream).text
        if cursor["tails"].get(family.name) == tail:
            continue
        partitions = slice_partitions(family)
        known = set(context.instance.get_dynamic_partitions(partitions.name))
        ids = [r.slice_id for r in list_slices(store, family.mirror_stream, table.slices_stream)]
        new = [i for i in ids if i not in known]
        if new:
            adds.append(partitions.build_add_request(new))
            job = replay_job_name(family)
            requests += [
                dg.RunRequest(run_key=f"{job}:{i}", job_name=job, partition_key=i) for i in new
            ]
        cursor["tails"][family.name] = tail
    why = "; ".join(skipped)
    return dg.SensorResult(
        run_requests=requests,
        dynamic_partitions_requests=adds,
        cursor=json.dumps(cursor),
        skip_reason=None if requests else why or "no new slices",
    )


def slices_sensor(
    families: Sequence[StreamFamily],
    interval_seconds: int,
    jobs: Sequence[dg.UnresolvedAssetJobDefinition],
) -> dg.SensorDefinition:
    description = "Adds a replay partition for every new slice and requests its replays."
    return store_sensor(
        NEW_SLICES_SENSOR,
        description,
        evaluate_slices,
        families=families,
        interval_seconds=interval_seconds,
        jobs=jobs,
    )


# --- the analytics views, behind their inputs ---------------------------------------------


def views_behind(
    instance: dg.DagsterInstance, views: dg.AssetKey, inputs: Sequence[dg.AssetKey]
) -> float | None:
    """The time of the newest materialization of `inputs` that the views' latest refresh
    started before (so may not show), or None when the views are current."""
    times = [
        found.records[0].timestamp
        for key in inputs
        if (found := instance.fetch_materializations(key, limit=1)).records
    ]
    if not times:
        return None
    newest = max(times)
    latest = instance.fetch_materializations(views, limit=1).records
    run = instance.get_run_record_by_id(latest[0].run_id) if latest else None
    started = run.start_time if run is not None else None
    return None if started is not None and started >= newest else newest


def evaluate_views(
    context: dg.SensorEvaluationContext,
    views: dg.AssetKey,
    inputs: Sequence[dg.AssetKey],
    job: str,
) -> dg.SensorResult:
    """A refresh of the views when an input changed after their latest refresh started and
    no refresh is under way; one request per newest input (its run key)."""
    newest = views_behind(context.instance, views, inputs)
    if newest is None:
        return dg.SensorResult(skip_reason="the views are current")
    unfinished = context.instance.get_run_records(dg.RunsFilter(statuses=UNFINISHED))
    if any(_refreshes(r.dagster_run, views, job) for r in unfinished):
        return dg.SensorResult(skip_reason="a refresh of the views is under way")
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"{job}:{newest}", job_name=job)])


def _refreshes(run: dg.DagsterRun, views: dg.AssetKey, job: str) -> bool:
    """Whether `run` refreshes the views: a run of the refresh job (whose runs carry no asset
    selection: the job selects the views alone) or one that selected them (eager(), the UI)."""
    return run.job_name == job or views in (run.asset_selection or ())


def views_sensor(
    views: dg.AssetKey,
    inputs: Sequence[dg.AssetKey],
    job: dg.UnresolvedAssetJobDefinition,
    interval_seconds: int,
) -> dg.SensorDefinition:
    """Refreshes the analytics views that `eager()` left behind: its trigger (an input newly
    updated since the previous tick) and its reset (the views newly updated) fire on the same
    tick when a refresh ends between two ticks in which an input changes, and that change is
    then never refreshed. This compares times instead: an input materialized after the start
    of the views' latest refresh."""
    inputs = tuple(inputs)

    @dg.sensor(
        name=VIEWS_SENSOR,
        minimum_interval_seconds=interval_seconds,
        jobs=[job],
        description="Refreshes the analytics views when an input changed after their latest "
        "refresh started (what the automation condition can miss).",
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return evaluate_views(context, views, inputs, job.name)

    return _sensor
