"""The asset factory: one family of assets, checks and jobs per `[streams.NAME]` of sluice.toml.

    <name>/edge_stream (observed) -> <name>/cloud_mirror -> <name>/parquet_export, <name>/csv_export

Everything of a family carries its name as the group, so the UI shows one lineage graph per
configured stream; adding a stream to sluice.toml adds a family, with no code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

from assets.edge import edge_asset
from assets.instance import EXCLUSIVE_TAG
from assets.streaming import FamilyJobs, export_assets, export_key, mirror_asset, mirror_key
from pipeline.settings import SluiceSettings, StreamFamily

#: Steps run in their own processes (one Spark session each), at most this many at once.
EXECUTOR = dg.multiprocess_executor.configured({"max_concurrent": 2})


def catch_up_job_name(family: StreamFamily) -> str:
    return f"catch_up_{family.name}"


def exclusive_tags(job: str, family: StreamFamily) -> dict[str, str]:
    """Run tags that queue runs of one streaming job of one family one at a time."""
    return {EXCLUSIVE_TAG: f"{job}/{family.name}"}


@dataclass(frozen=True)
class FamilyDefinitions:
    family: StreamFamily
    jobs_spec: FamilyJobs
    assets: list[dg.AssetsDefinition] = field(default_factory=list)
    checks: list[dg.AssetChecksDefinition] = field(default_factory=list)
    jobs: list[dg.UnresolvedAssetJobDefinition] = field(default_factory=list)


def family_definitions(family: StreamFamily, settings: SluiceSettings) -> FamilyDefinitions:
    """The assets, checks and jobs of one stream family."""
    jobs = FamilyJobs.of(family, dict(settings.stores), settings.export_formats)
    assets = [edge_asset(family), mirror_asset(family, jobs), export_assets(family, jobs)]
    streaming = [mirror_key(family), *(export_key(family, f) for f in settings.export_formats)]
    catch_up = dg.define_asset_job(
        catch_up_job_name(family),
        selection=dg.AssetSelection.assets(*streaming),
        executor_def=EXECUTOR,
        tags=exclusive_tags("catch_up", family),
        description=f"Catch {family.name} up to the edge tail: mirror, then exports "
        "(availableNow runs on the streaming jobs' checkpoints).",
    )
    return FamilyDefinitions(family, jobs, assets=assets, jobs=[catch_up])
