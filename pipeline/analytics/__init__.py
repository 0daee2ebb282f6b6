"""Analytics: the DuckDB database analysts query, and the charts drawn from it.

`catalog` builds `$SLUICE_HOME/analytics.duckdb` (views over file paths, no Sluice needed to
open it); `rates` holds seed 000's per-sample Mbit/s columns as SQL; `plot` draws them.
"""
