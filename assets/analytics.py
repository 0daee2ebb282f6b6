"""The analysts' DuckDB views over everything the families wrote, and the rate plot.

`analytics/duckdb_views` refreshes the views of the analytics database
(`pipeline/analytics/catalog.py`: a view per export and per kind, samples, rates, quarantine,
slices, slice_rows, lineage, replays, sources) after taking a snapshot of the slices of every
store in sluice.toml, as `sluice analytics refresh` does, and draws the NIC rate plot of each
NIC export. It depends on every export, slices and replay asset, so the blocking checks of the
exports and replays keep it back when they fail: analysts never see unchecked data. It is the
only asset that writes the database; the resource only reads it, in its sandbox.
"""

import base64
from collections.abc import Sequence
from typing import Any

import dagster as dg
from dagster import AssetExecutionContext

from assets.keys import ANALYTICS_GROUP, ANALYTICS_KEY, ANALYTICS_POOL
from pipeline.analytics.catalog import refresh
from pipeline.analytics.plot import plot_rates
from pipeline.analytics.snapshots import collect_slices, snapshot_slices
from pipeline.analytics.sources import (
    FIXED_VIEWS,
    AnalyticsError,
    AnalyticsPaths,
    discover_exports,
)
from pipeline.errors import SluiceError
from pipeline.outputs import OutputNotWritable, check_writable
from pipeline.settings import SluiceSettings
from resources.analytics import AnalyticsResource

COUNTED_VIEWS = tuple(v for v in FIXED_VIEWS if v != "sources")


def view_counts(analytics: AnalyticsResource) -> dict[str, int]:
    with analytics.connect() as con:
        return {v: con.execute(f'SELECT count(*) FROM "{v}"').fetchone()[0] for v in COUNTED_VIEWS}


def nic_exports(analytics: AnalyticsResource) -> set[str]:
    with analytics.connect() as con:
        sql = "SELECT DISTINCT export FROM samples WHERE kind = 'NetworkSamples'"
        return {row[0] for row in con.execute(sql).fetchall()}


def plot_markdown(png: bytes, title: str) -> dg.MetadataValue:
    encoded = base64.b64encode(png).decode()
    return dg.MetadataValue.md(f"![{title}](data:image/png;base64,{encoded})")


def check_home(paths: AnalyticsPaths, settings: SluiceSettings) -> None:
    """Refuse an analytics home (run config from the launchpad) other than the Sluice home
    the definitions were built with: the exports and their records would be read from the
    one, the replay lineage and results from the other, and views silently lose rows."""
    if paths.home.absolute() == settings.home.absolute():
        return
    msg = (
        f"the analytics resource's run config sets home {str(paths.home)!r}, but the exports, "
        f"slices, lineage and replays of this code location are under {str(settings.home)!r} "
        "(SLUICE_HOME): a refresh would read half of them; set `database` alone to write the "
        "database elsewhere, or change SLUICE_HOME and reload the code location"
    )
    raise dg.Failure(description=msg)


def analytics_asset(
    settings: SluiceSettings, upstream: Sequence[dg.AssetKey]
) -> dg.AssetsDefinition:
    """`analytics/duckdb_views`: views over the exports, slices, lineage and replays."""

    @dg.asset(
        key=ANALYTICS_KEY,
        deps=list(upstream),
        group_name=ANALYTICS_GROUP,
        kinds={"duckdb"},
        # one refresh at a time, however launched (the views' sensor, eager(), the UI): a
        # second writer of the database would fail on DuckDB's file lock
        pool=ANALYTICS_POOL,
        # with the daemon running, the views follow their upstream (blocking checks first)
        automation_condition=dg.AutomationCondition.eager(),
        description="The analysts' DuckDB database: views over every export (samples, rates, "
        "quarantine), the slices, the replay lineage and results; and the NIC rate plots. "
        f"Open it with duckdb: {settings.analytics_database}",
    )
    def _views(
        context: AssetExecutionContext, analytics: AnalyticsResource
    ) -> dg.MaterializeResult:
        paths = analytics.paths
        try:  # before the slices' snapshot, which is written first
            check_writable(paths.snapshots, "analytics directory")
            check_writable(paths.database, "analytics database", file=True)
        except OutputNotWritable as exc:
            raise dg.Failure(description=str(exc)) from None
        check_home(paths, settings)
        try:  # Sluice's one-line reason (a damaged export file, a store that cannot be read)
            slices = snapshot_slices(paths, collect_slices(settings))
            sources = discover_exports(settings)
            views = refresh(paths, sources, lambda line: context.log.info(f"rates: {line}"))
            counts, nics = view_counts(analytics), nic_exports(analytics)
        except SluiceError as exc:
            raise dg.Failure(description=str(exc)) from None
        metadata: dict[str, Any] = {
            "database": dg.MetadataValue.path(str(paths.database)),
            "views": dg.MetadataValue.text(", ".join(views)),
            "slices": dg.MetadataValue.int(slices),
        }
        metadata.update({f"rows/{v}": dg.MetadataValue.int(n) for v, n in counts.items()})
        for source in sources:
            if source.name not in nics:
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
