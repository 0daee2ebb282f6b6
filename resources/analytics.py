"""DuckDB analytics as a Dagster resource (the shape of `dagster_duckdb`'s resource).

A thin wrapper over `pipeline.analytics`: `paths` is where the analytics database and the
files it reads live (`AnalyticsPaths`), and `connect()` opens the database for the length of
a `with` block. DuckDB lets one process write a database file at a time, so a connection is
never held between steps (an analyst's `duckdb` shell can open it read-only in between).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from pipeline.analytics.catalog import AnalyticsPaths

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
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection to the analytics database, closed when the block ends."""
        import duckdb

        path = Path(self.database)
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        conn = duckdb.connect(str(path), read_only=read_only)
        try:
            yield conn
        finally:
            conn.close()
