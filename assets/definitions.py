"""Sluice's Dagster definitions: one asset family per stream of `sluice.toml`, plus resources.

`defs` is loaded lazily (`@dg.definitions`): sluice.toml and `SLUICE_*` are read when Dagster
loads the code location, not when this module is imported. `build_definitions(settings)` is
the same thing for an explicit configuration (tests, the demo).
"""

from __future__ import annotations

import dagster as dg

from assets.edge import edge_asset, edge_key
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
    assets = [edge_asset(family) for family in settings.streams]
    observe_job = dg.define_asset_job(
        "observe_edge_streams",
        selection=dg.AssetSelection.assets(*(edge_key(f) for f in settings.streams)),
        description="Observe every edge stream: record its tail cut as its data version.",
    )
    return dg.Definitions(
        assets=assets,
        jobs=[observe_job],
        resources=build_resources(settings),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(load_settings())
