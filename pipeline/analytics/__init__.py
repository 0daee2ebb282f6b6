"""Analytics: the DuckDB database analysts query, and the charts drawn from it.

`catalog` builds the database (`$SLUICE_HOME/analytics/sluice.duckdb`: views over file paths,
no Sluice needed to open it); `rates` holds the per-sample NIC Mbit/s columns as SQL; `plot`
draws them (`DESIGN.md`).
"""
