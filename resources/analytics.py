"""DuckDB over the exports as a Dagster resource (the shape of `dagster_duckdb`'s resource).

`connect()` opens the analytics database for the length of a `with` block and closes it: DuckDB
lets one process write a database file at a time, so a connection is never held between steps
(an analyst's `duckdb` shell can open it read-only in between). `exports_dir` is where the
Parquet and CSV exports live, one directory per stream family.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:
    import duckdb


class AnalyticsResource(dg.ConfigurableResource):
    """The DuckDB database of analytics views and the export directory it reads."""

    database: str
    exports_dir: str

    @property
    def database_path(self) -> Path:
        return Path(self.database)

    @property
    def exports_path(self) -> Path:
        return Path(self.exports_dir)

    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection to the analytics database, closed when the block ends."""
        import duckdb

        if not read_only:
            self.database_path.parent.mkdir(parents=True, exist_ok=True)
        conn = duckdb.connect(str(self.database_path), read_only=read_only)
        try:
            yield conn
        finally:
            conn.close()
