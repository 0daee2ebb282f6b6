"""Two replays of one slice side by side: metrics, and the rows only one of them produced
(`sluice replay --compare`, the replays' determinism check)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipeline.jobs.replay.lineage import LineageRecord, ReplayResult


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two replays of one slice side by side: metrics, and rows only one of them produced."""

    slice_id: str
    a: LineageRecord
    b: LineageRecord
    metrics: list[tuple[str, Any, Any]]
    only_a: int
    only_b: int
    sample_a: list[dict]
    sample_b: list[dict]
    columns_differ: bool

    @property
    def identical(self) -> bool:
        same_metrics = all(x == y for name, x, y in self.metrics if name not in RUN_KEYS)
        return same_metrics and not (self.only_a or self.only_b or self.columns_differ)

    def as_dict(self) -> dict[str, Any]:
        return {
            "slice_id": self.slice_id,
            "a": _side(self.a),
            "b": _side(self.b),
            "identical": self.identical,
            "metrics": [{"metric": n, "a": x, "b": y} for n, x, y in self.metrics],
            "columns_differ": self.columns_differ,
            "rows_only_in_a": self.only_a,
            "rows_only_in_b": self.only_b,
            "sample_only_in_a": self.sample_a,
            "sample_only_in_b": self.sample_b,
        }


def _side(lineage: LineageRecord) -> dict[str, Any]:
    return {
        "model": lineage.model,
        "version": lineage.model_version,
        "params": json.loads(lineage.params),
        "params_hash": lineage.params_hash,
        "run": lineage.run_id,
        "results": lineage.results_path,
    }


#: Metrics that name a replay rather than measure it: never a difference worth showing.
RUN_KEYS = ("run_id", "model", "model_version", "params", "params_hash")


def _flat_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, dict) and key != "params":
            flat.update(_flat_metrics(value, f"{prefix}{key}."))
        elif key != "slice_id":
            flat[f"{prefix}{key}"] = value
    return flat


def compare(a: ReplayResult, b: ReplayResult, sample: int = 10) -> Comparison:
    """Metrics side by side, and the rows (as multisets) that only one replay produced."""
    import duckdb

    ma, mb = _flat_metrics(a.metrics), _flat_metrics(b.metrics)
    names = list(dict.fromkeys([*ma, *mb]))
    metrics = [(n, ma.get(n), mb.get(n)) for n in names]
    columns_differ = a.results.schema.names != b.results.schema.names
    con = duckdb.connect()
    try:
        con.register("a", a.results)
        con.register("b", b.results)
        if columns_differ:
            only_a, only_b = a.results.num_rows, b.results.num_rows
            rows_a = a.results.slice(0, sample).to_pylist()
            rows_b = b.results.slice(0, sample).to_pylist()
        else:
            diff_a = "SELECT * FROM a EXCEPT ALL SELECT * FROM b"
            diff_b = "SELECT * FROM b EXCEPT ALL SELECT * FROM a"
            only_a = con.sql(f"SELECT count(*) FROM ({diff_a})").fetchall()[0][0]
            only_b = con.sql(f"SELECT count(*) FROM ({diff_b})").fetchall()[0][0]
            rows_a = con.sql(f"{diff_a} LIMIT {int(sample)}").to_arrow_table().to_pylist()
            rows_b = con.sql(f"{diff_b} LIMIT {int(sample)}").to_arrow_table().to_pylist()
    finally:
        con.close()
    return Comparison(
        a.lineage.slice_id,
        a.lineage,
        b.lineage,
        metrics,
        only_a,
        only_b,
        rows_a,
        rows_b,
        columns_differ,
    )
