"""The analysts' DuckDB views over everything the families wrote, and the rate plot.

`analytics/duckdb_views` refreshes the views of the analytics database
(`pipeline/analytics/catalog.py`: samples, rates, quarantine, slices, lineage, replays) after
taking a snapshot of every family's slices, and draws the NIC rate plot of each export that
has one. It depends on every export, slices and replay asset, so the blocking checks of the
exports and replays keep it back when they fail: analysts never see unchecked data.
"""

import base64
from collections.abc import Sequence
from typing import Any

import dagster as dg
from dagster import AssetExecutionContext

from assets.keys import ANALYTICS_GROUP, ANALYTICS_KEY
from pipeline.analytics.catalog import (
    AnalyticsError,
    discover_exports,
    refresh,
    snapshot_slices,
)
from pipeline.analytics.plot import plot_rates
from pipeline.jobs.slices import SliceRecord, list_slices
from pipeline.settings import SluiceSettings
from resources.analytics import AnalyticsResource
from resources.stores import StreamStoresResource

COUNTED_VIEWS = ("samples", "rates", "quarantine", "slices", "lineage", "replays")


def all_slices(settings: SluiceSettings, stores: StreamStoresResource) -> list[SliceRecord]:
    records: list[SliceRecord] = []
    for family in settings.streams:
        if family.bookmark is not None:
            store = stores.open(family.mirror_store)
            records += list_slices(store, family.mirror_stream, family.bookmark.slices_stream)
    return records


def view_counts(analytics: AnalyticsResource) -> dict[str, int]:
    with analytics.connect(read_only=True) as con:
        return {v: con.execute(f'SELECT count(*) FROM "{v}"').fetchone()[0] for v in COUNTED_VIEWS}


def plot_markdown(png: bytes, title: str) -> dg.MetadataValue:
    encoded = base64.b64encode(png).decode()
    return dg.MetadataValue.md(f"![{title}](data:image/png;base64,{encoded})")


def analytics_asset(
    settings: SluiceSettings, upstream: Sequence[dg.AssetKey]
) -> dg.AssetsDefinition:
    """`analytics/duckdb_views`: views over the exports, slices, lineage and replays."""

    @dg.asset(
        key=ANALYTICS_KEY,
        deps=list(upstream),
        group_name=ANALYTICS_GROUP,
        kinds={"duckdb"},
        # with the daemon running, the views follow their upstream (blocking checks first)
        automation_condition=dg.AutomationCondition.eager(),
        description="The analysts' DuckDB database: views over every export (samples, rates, "
        "quarantine), the slices, the replay lineage and results; and the NIC rate plots. "
        f"Open it with duckdb: {settings.analytics_database}",
    )
    def _views(
        context: AssetExecutionContext, analytics: AnalyticsResource, stores: StreamStoresResource
    ) -> dg.MaterializeResult:
        paths = analytics.paths
        slices = all_slices(settings, stores)
        snapshot_slices(paths, slices)
        sources = discover_exports(settings)
        views = refresh(paths, sources)
        metadata: dict[str, Any] = {
            "database": dg.MetadataValue.path(str(paths.database)),
            "views": dg.MetadataValue.text(", ".join(views)),
            "slices": dg.MetadataValue.int(len(slices)),
        }
        metadata.update(
            {f"rows/{v}": dg.MetadataValue.int(n) for v, n in view_counts(analytics).items()}
        )
        for source in sources:
            if f"{source.view}_rates" not in views:
                continue
            try:
                plot = plot_rates(paths, source)
            except AnalyticsError as exc:
                context.log.warning(f"no rate plot for {source.name}: {exc}")
                metadata[f"rate_plot/{source.name}"] = dg.MetadataValue.text(f"not drawn: {exc}")
                continue
            metadata[f"rate_plot/{source.name}"] = dg.MetadataValue.path(str(plot.path))
            metadata[f"rate_plot_image/{source.name}"] = plot_markdown(
                plot.path.read_bytes(), f"{source.name} rx/tx Mbit/s"
            )
        return dg.MaterializeResult(metadata=metadata)

    return _views
