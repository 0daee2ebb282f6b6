"""The asset factory: one family of assets, checks, jobs and automation per `[streams.NAME]`.

    <name>/edge_stream (observed) -> <name>/cloud_mirror -> <name>/parquet_export
                                                          -> <name>/csv_export
                                         <name>/cloud_mirror -> <name>/slices
                                                 -> <name>/replay_<model> (a partition per slice)

Everything of a family carries its name as group and key prefix, so the UI shows one lineage
graph per configured stream; adding a stream to sluice.toml adds a family, with no code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

from assets.instance import EXCLUSIVE_TAG
from pipeline.settings import SluiceSettings, StreamFamily

#: Steps run in their own processes (one Spark session each), at most this many at once.
EXECUTOR = dg.multiprocess_executor.configured({"max_concurrent": 2})


def catch_up_job_name(family: StreamFamily) -> str:
    return f"catch_up_{family.name}"


def replay_job_name(family: StreamFamily) -> str:
    return f"replay_{family.name}"


def exclusive_tags(job: str, family: StreamFamily) -> dict[str, str]:
    """Run tags that queue runs of one streaming job of one family one at a time."""
    return {EXCLUSIVE_TAG: f"{job}/{family.name}"}


@dataclass(frozen=True)
class FamilyDefinitions:
    """What the factory made for one family."""

    family: StreamFamily
    assets: list[dg.AssetsDefinition] = field(default_factory=list)
    checks: list[dg.AssetChecksDefinition] = field(default_factory=list)
    jobs: list[dg.UnresolvedAssetJobDefinition] = field(default_factory=list)
    schedules: list[dg.ScheduleDefinition] = field(default_factory=list)
    watched: list = field(default_factory=list)  # assets.services.Watched
    published: list[dg.AssetKey] = field(default_factory=list)  # what analytics reads

    def job(self, name: str) -> dg.UnresolvedAssetJobDefinition:
        return next(j for j in self.jobs if j.name == name)


def family_definitions(family: StreamFamily, settings: SluiceSettings) -> FamilyDefinitions:
    """The assets, checks, jobs, schedule and watched checkpoints of one stream family."""
    from assets.checks import export_checks, mirror_lag_check
    from assets.edge import edge_asset
    from assets.replays import replay_asset, replay_key
    from assets.schedules import nightly_replays
    from assets.services import Watched
    from assets.slices import bookmark_spec, slices_asset, slices_key
    from assets.streaming import FamilyJobs, export_assets, export_key, mirror_asset, mirror_key
    from pipeline.jobs.checkpoint import default_checkpoint

    jobs = FamilyJobs.of(family, dict(settings.stores), settings.export_formats)
    exports = [export_key(family, f) for f in settings.export_formats]
    defs = FamilyDefinitions(
        family,
        assets=[edge_asset(family), mirror_asset(family, jobs), export_assets(family, jobs)],
        checks=[mirror_lag_check(family, jobs, settings.checks)],
        watched=[
            Watched("mirror", family.name, jobs.checkpoint("mirror"), (mirror_key(family),)),
            Watched("export", family.name, jobs.checkpoint("export"), tuple(exports)),
        ],
        published=[export_key(family, "parquet")] if "parquet" in settings.export_formats else [],
    )
    if "parquet" in settings.export_formats:
        defs.checks.append(export_checks(family, jobs, settings.checks))
    streaming = [mirror_key(family), *exports]
    if family.bookmark is not None:
        cloud = settings.stores[family.mirror_store]
        defs.assets.append(slices_asset(family, cloud))
        spec = bookmark_spec(family, cloud)
        checkpoint = default_checkpoint("bookmark", spec.stream, spec.slices_stream)
        defs.watched.append(Watched("bookmark", family.name, checkpoint, (slices_key(family),)))
        defs.published.append(slices_key(family))
        streaming.append(slices_key(family))
    defs.jobs.append(
        dg.define_asset_job(
            catch_up_job_name(family),
            selection=dg.AssetSelection.assets(*streaming),
            executor_def=EXECUTOR,
            tags=exclusive_tags("catch_up", family),
            description=f"Catch {family.name} up to the edge tail: mirror, exports, slices "
            "(availableNow runs on the streaming jobs' checkpoints).",
        )
    )
    if family.models:
        replays = [
            replay_asset(family, name, settings.models[name], settings.home)
            for name in family.models
        ]
        defs.assets.extend(replays)
        keys = [replay_key(family, name) for name in family.models]
        defs.published.extend(keys)
        job = dg.define_asset_job(
            replay_job_name(family),
            selection=dg.AssetSelection.assets(*keys),
            executor_def=EXECUTOR,
            description=f"Replay one slice of {family.name} through every model of the family.",
        )
        defs.jobs.append(job)
        versions = {a.key: a.code_versions_by_key[a.key] for a in replays}
        defs.schedules.append(
            nightly_replays(
                family, job, versions, settings.dagster.replay_schedule, settings.dagster.timezone
            )
        )
    return defs
