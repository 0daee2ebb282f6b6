"""Sluice's Dagster definitions: one asset family per stream of `sluice.toml`, plus resources.

`defs` is loaded lazily (`@dg.definitions`): sluice.toml and `SLUICE_*` are read when Dagster
loads the code location, not when this module is imported. `build_definitions(settings)` is
the same thing for an explicit configuration (tests, the demo).
"""

from __future__ import annotations

import dagster as dg

from assets.edge import edge_key
from assets.family import EXECUTOR, family_definitions
from assets.sensors import tail_sensor
from pipeline.settings import SluiceSettings, load_settings
from resources import AnalyticsResource, SparkResource, StreamStoresResource


def build_resources(settings: SluiceSettings) -> dict[str, dg.ConfigurableResource]:
    return {
        "stores": StreamStoresResource(uris=dict(settings.stores)),
        "spark": SparkResource(),
        "analytics": AnalyticsResource(
            database=str(settings.analytics_database), exports_dir=str(settings.exports_dir)
        ),
    }


def build_definitions(settings: SluiceSettings) -> dg.Definitions:
    """Assets, checks, jobs, sensors and schedules for every configured stream family."""
    families = [family_definitions(f, settings) for f in settings.streams]
    observe_job = dg.define_asset_job(
        "observe_edge_streams",
        selection=dg.AssetSelection.assets(*(edge_key(f) for f in settings.streams)),
        description="Observe every edge stream: record its tail cut as its data version.",
    )
    jobs = [observe_job, *(job for f in families for job in f.jobs)]
    catch_up_jobs = [job for f in families for job in f.jobs if job.name.startswith("catch_up_")]
    return dg.Definitions(
        assets=[a for f in families for a in f.assets],
        asset_checks=[c for f in families for c in f.checks],
        jobs=jobs,
        sensors=[
            tail_sensor(
                settings.streams, settings.dagster.tail_sensor_interval_seconds, catch_up_jobs
            )
        ],
        resources=build_resources(settings),
        executor=EXECUTOR,
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(load_settings())
