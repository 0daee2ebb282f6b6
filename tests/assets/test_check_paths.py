"""The export checks read the export's own files when its directory's name holds DuckDB's
wildcards (`[`, `*`, `?`), never a neighbour's that the name would match as a pattern."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from assets.checks import parquet_glob, quarantine_glob


def test_the_checks_read_only_the_export_named(tmp_path):
    ours, neighbour = tmp_path / "site[1]*?", tmp_path / "site1XY"
    for root, rows in ((ours, 3), (neighbour, 5)):
        for folder in ("parquet/date=2026-11-27/hour=10", "_quarantine"):
            (root / folder).mkdir(parents=True)
            pq.write_table(pa.table({"x": list(range(rows))}), root / folder / "part-0.parquet")
    for glob in (parquet_glob(ours), quarantine_glob(ours)):
        assert glob is not None
        [(count,)] = duckdb.execute("SELECT count(*) FROM read_parquet(?)", [glob]).fetchall()
        assert count == 3
    assert parquet_glob(tmp_path / "empty") is None
