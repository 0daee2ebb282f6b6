"""DuckDB analytics as a Dagster resource (the shape of `dagster_duckdb`'s resource).

A thin wrapper over `pipeline.analytics`: `paths` is where the analytics database and the
files it reads live (`AnalyticsPaths`), and `connect()` opens the database for the length of
a `with` block, read-only and in the same sandbox as `sluice sql`
(`pipeline/analytics/sandbox.py`: only Sluice's data directories, no file writes, no
extensions, no network). Only the analytics asset rebuilds the views (`catalog.refresh`). A
connection is never held between steps, so a refresh can take the file's write lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from pipeline.analytics.sandbox import open_database
from pipeline.analytics.sources import AnalyticsError, AnalyticsPaths

if TYPE_CHECKING:
    import duckdb


class AnalyticsResource(dg.ConfigurableResource):
    """The analytics database (`[analytics] database`) under the Sluice home."""

    home: str
    database: str

    @property
    def paths(self) -> AnalyticsPaths:
        return AnalyticsPaths(Path(self.home), Path(self.database))

    @contextmanager
    def connect(self, read_only: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only, sandboxed connection to the analytics database, closed when the block
        ends (`AnalyticsError` when the views were never built or are of another version)."""
        if not read_only:
            reason = (
                "the analytics resource only reads; the views are rebuilt by the "
                "analytics/duckdb_views asset (pipeline.analytics.catalog.refresh)"
            )
            raise AnalyticsError(str(self.database), reason)
        with open_database(self.paths) as conn:
            yield conn
