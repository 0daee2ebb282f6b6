"""Sluice's Dagster definitions: one asset family per stream of `sluice.toml`, plus resources.

`defs` is loaded lazily (`@dg.definitions`): sluice.toml and `SLUICE_*` are read when Dagster
loads the code location, not when this module is imported. `build_definitions(settings)` is
the same thing for an explicit configuration (tests, the demo).
"""

from __future__ import annotations

import dagster as dg

from assets.analytics import analytics_asset
from assets.family import EXECUTOR, FamilyDefinitions, family_definitions
from assets.keys import OBSERVE_EDGE_JOB, REFRESH_ANALYTICS_JOB, edge_key
from assets.sensors import slices_sensor, tail_sensor, views_sensor
from assets.services import services_sensor
from pipeline.settings import SluiceSettings, load_settings
from pipeline.spark.session import SparkSettings
from resources import AnalyticsResource, SparkResource, StreamStoresResource


def build_resources(settings: SluiceSettings) -> dict[str, dg.ConfigurableResource]:
    return {
        "stores": StreamStoresResource(uris=dict(settings.stores)),
        "spark": SparkResource.from_settings(SparkSettings.from_config({"spark": settings.spark})),
        "analytics": AnalyticsResource(
            home=str(settings.home), database=str(settings.analytics_database)
        ),
    }


def build_sensors(
    settings: SluiceSettings, families: list[FamilyDefinitions]
) -> list[dg.SensorDefinition]:
    interval = settings.dagster.tail_sensor_interval_seconds
    sensors = [
        tail_sensor(settings.streams, interval, [f.catch_up_job for f in families]),
        services_sensor([w for f in families for w in f.watched], interval),
    ]
    replay_jobs = [f.replay_job for f in families if f.replay_job is not None]
    if replay_jobs:
        with_models = [f.family for f in families if f.replay_job is not None]
        sensors.append(slices_sensor(with_models, interval, replay_jobs))
    return sensors


def build_definitions(settings: SluiceSettings) -> dg.Definitions:
    """Assets, checks, jobs, sensors and schedules for every configured stream family."""
    families = [family_definitions(f, settings) for f in settings.streams]
    observe_job = dg.define_asset_job(
        OBSERVE_EDGE_JOB,
        selection=dg.AssetSelection.assets(*(edge_key(f) for f in settings.streams)),
        description="Observe every edge stream: record its tail cut as its data version.",
    )
    analytics = analytics_asset(settings, [k for f in families for k in f.published])
    refresh_job = dg.define_asset_job(
        REFRESH_ANALYTICS_JOB,
        selection=dg.AssetSelection.assets(analytics.key),
        description="Refresh the DuckDB views and the rate plots.",
    )
    inputs = [k for f in families for k in f.published]
    behind = views_sensor(
        analytics.key, inputs, refresh_job, settings.dagster.tail_sensor_interval_seconds
    )
    return dg.Definitions(
        assets=[*(a for f in families for a in f.assets), analytics],
        asset_checks=[c for f in families for c in f.checks],
        jobs=[observe_job, refresh_job, *(j for f in families for j in f.jobs)],
        sensors=[*build_sensors(settings, families), behind],
        schedules=[s for f in families for s in f.schedules],
        resources=build_resources(settings),
        executor=EXECUTOR,
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(load_settings())
