"""The asset factory: one family of assets, checks, jobs and automation per `[streams.NAME]`.

    <name>/edge_stream (observed) -> <name>/cloud_mirror -> <name>/parquet_export
                                                          -> <name>/csv_export
                                         <name>/cloud_mirror -> <name>/slices
                                                 -> <name>/replay_<model> (a partition per slice)

Everything of a family carries its name as group and key prefix, so the UI shows one lineage
graph per configured stream; adding a stream to sluice.toml adds a family, with no code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from assets.catch_up import CatchUpStep, FamilyJobs, catch_up_asset, export_step, mirror_step
from assets.checks import export_checks, mirror_lag_check
from assets.edge import edge_asset
from assets.keys import catch_up_job_name, catch_up_tags, export_key, replay_job_name, slices_key
from assets.replays import replay_asset
from assets.schedules import nightly_replays
from assets.services import Watched
from assets.slices import slices_step
from pipeline.settings import SluiceSettings, StreamFamily

#: A run's steps run one after another in the run's own process and share its Spark session
#: (one JVM per run, started by the first step that needs Spark, none for a run that finds
#: nothing new): on a small machine, a process and a JVM per step cost more than the steps'
#: parallelism gains (`DESIGN.md`, "One process per run").
EXECUTOR = dg.in_process_executor


@dataclass(frozen=True, slots=True)
class FamilyDefinitions:
    """What the factory made for one family."""

    family: StreamFamily
    assets: tuple[dg.AssetsDefinition, ...]
    checks: tuple[dg.AssetChecksDefinition, ...]
    catch_up_job: dg.UnresolvedAssetJobDefinition
    replay_job: dg.UnresolvedAssetJobDefinition | None  # None: the family has no models
    schedules: tuple[dg.ScheduleDefinition, ...]
    watched: tuple[Watched, ...]  # checkpoints whose services' progress the UI shows
    published: tuple[dg.AssetKey, ...]  # what the analytics views read

    @property
    def jobs(self) -> tuple[dg.UnresolvedAssetJobDefinition, ...]:
        return tuple(job for job in (self.catch_up_job, self.replay_job) if job is not None)


def catch_up_job(
    family: StreamFamily, steps: Sequence[CatchUpStep[Any]]
) -> dg.UnresolvedAssetJobDefinition:
    """The family's catch-up job: every catch-up step, its runs queued one at a time."""
    return dg.define_asset_job(
        catch_up_job_name(family),
        selection=dg.AssetSelection.assets(*(key for step in steps for key in step.keys)),
        executor_def=EXECUTOR,
        tags=catch_up_tags(family),
        description=f"Catch {family.name} up to the edge tail: mirror, exports, slices "
        "(availableNow runs on the streaming jobs' checkpoints).",
    )


def replay_job(
    family: StreamFamily, replays: Sequence[dg.AssetsDefinition]
) -> dg.UnresolvedAssetJobDefinition:
    return dg.define_asset_job(
        replay_job_name(family),
        selection=dg.AssetSelection.assets(*(replay.key for replay in replays)),
        executor_def=EXECUTOR,
        description=f"Replay one slice of {family.name} through every model of the family.",
    )


def family_definitions(family: StreamFamily, settings: SluiceSettings) -> FamilyDefinitions:
    """The assets, checks, jobs, schedule and watched checkpoints of one stream family."""
    jobs = FamilyJobs.of(family, dict(settings.stores), settings.export_formats)
    steps: list[CatchUpStep[Any]] = [mirror_step(family, jobs), export_step(family, jobs)]
    checks = [mirror_lag_check(family, jobs, settings.checks)]
    published: list[dg.AssetKey] = []
    if "parquet" in settings.export_formats:
        checks.append(export_checks(family, jobs, settings.checks))
        published.append(export_key(family, "parquet"))
    if family.bookmark is not None:
        steps.append(slices_step(family))
        published.append(slices_key(family))
    replays = [
        replay_asset(family, name, settings.models[name], settings.home) for name in family.models
    ]
    published += [replay.key for replay in replays]
    replay = replay_job(family, replays) if replays else None
    schedules = []
    if replay is not None:
        schedules.append(nightly_replays(family, replay, replays, settings.dagster))
    return FamilyDefinitions(
        family,
        assets=(edge_asset(family), *(catch_up_asset(step) for step in steps), *replays),
        checks=tuple(checks),
        catch_up_job=catch_up_job(family, steps),
        replay_job=replay,
        schedules=tuple(schedules),
        watched=tuple(Watched(s.job, family.name, s.checkpoint, s.keys) for s in steps),
        published=tuple(published),
    )
