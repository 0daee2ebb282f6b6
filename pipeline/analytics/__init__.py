"""Analytics: the DuckDB database analysts query, and the charts drawn from it.

`sources` says where the data is (exports, snapshots, the database file); `snapshots` turns
the slices and the replay lineage into Parquet; `catalog` rebuilds the database's views
(`$SLUICE_HOME/analytics/sluice.duckdb`: views over file paths, no Sluice needed to open it),
the only thing that writes it; `sandbox` reads it, read-only and closed to everything but
Sluice's data directories; `rates` holds the per-sample NIC Mbit/s as SQL, `rates_table` the
table of them a refresh keeps up to date, which the `rates` view scans; `comments` what
every view and column means; `plot` draws the rates (`DESIGN.md`).
"""
