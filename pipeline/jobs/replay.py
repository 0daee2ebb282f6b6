"""Replays: run a model over exactly one slice of a stream's history, and record the lineage.

(The replay itself is added below the lineage record as the Spark source lands.)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

LINEAGE_VERSION = 1


@dataclass(frozen=True, slots=True)
class LineageRecord:
    """What one replay run read, ran and wrote: enough to follow any result row back to
    stream positions and to the exact model code. Stored as `$SLUICE_HOME/lineage/<run_id>.json`
    (the `lineage` view of the analytics database reads them)."""

    run_id: str
    slice_id: str
    stream: str
    sensor: str | None
    start_cut: str
    end_cut: str
    start_time_ns: int
    end_time_ns: int
    input_events: int
    input_rows: int
    output_rows: int
    model: str
    model_version: str
    output_dir: str
    results_path: str
    metrics_path: str
    started_at: str
    finished_at: str
    version: int = LINEAGE_VERSION

    def write(self, lineage_dir: Path) -> Path:
        """Write (atomically replace) this run's record; return its path."""
        lineage_dir.mkdir(parents=True, exist_ok=True)
        path = lineage_dir / f"{self.run_id}.json"
        staging = path.with_suffix(".json.tmp")
        staging.write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")
        staging.replace(path)
        return path
