"""What a replay is and what it leaves: its identity (`ReplayKey`, which names its run id
and directory) and its lineage record, from every result back to stream positions, model code
and parameters."""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline import durable
from pipeline.jobs.replay.errors import BadLineageRecord
from pipeline.jobs.replay.model import Model, hash_params_text

LINEAGE_VERSION = 2
#: lineage records this Sluice reads: version 1 had no `params_hash` (it is computed from
#: `params`, which version 1 already wrote in the canonical form)
READABLE_LINEAGE_VERSIONS = (1, 2)


@dataclass(frozen=True, slots=True)
class LineageRecord:
    """What one replay read, ran and wrote: enough to follow any result row back to stream
    positions, to the exact model code and to its parameters (`params`, canonical JSON, and
    `params_hash`, the SHA-256 of that text, in full). Stored as
    `$SLUICE_HOME/lineage/<run_id>.json` and beside the results (`lineage.json`); the
    `lineage` view of the analytics database reads them. `started_at`/`finished_at` are UTC
    ISO 8601 (the only fields a re-run changes)."""

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
    quarantined_events: int = 0
    params: str = "{}"
    params_hash: str = ""
    version: int = LINEAGE_VERSION

    def write(self, lineage_dir: Path) -> Path:
        """Write (atomically replace) this run's record; return its path."""
        return write_json(lineage_dir / f"{self.run_id}.json", asdict(self))

    @classmethod
    def read(cls, path: Path) -> LineageRecord:
        """A stored record of any readable version, as this version's record."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadLineageRecord(path, f"not readable JSON ({exc})") from None
        version = data.get("version") if isinstance(data, dict) else None
        if version not in READABLE_LINEAGE_VERSIONS:
            known = ", ".join(map(str, READABLE_LINEAGE_VERSIONS))
            raise BadLineageRecord(path, f"version {version!r}; this Sluice reads {known}")
        if version == 1:
            data = {**data, "params_hash": hash_params_text(data.get("params", "{}"))}
        names = {f.name for f in fields(cls)} - {"version"}
        required = {f.name for f in fields(cls) if f.default is MISSING}
        if missing := sorted(required - data.keys()):
            raise BadLineageRecord(path, f"missing {', '.join(missing)}")
        return cls(**{k: data[k] for k in names & data.keys()}, version=int(version))


@dataclass(frozen=True, slots=True)
class ReplayKey:
    """What a replay is: slice, model, code version and parameters. Its results, metrics and
    lineage are named by it, so an identical replay replaces its own files with the same
    bytes and any difference (parameters included) gets files of its own."""

    slice_id: str
    model: str
    model_version: str
    params_hash: str

    @classmethod
    def of(cls, slice_id: str, model: Model) -> ReplayKey:
        return cls(slice_id, model.spec, model.version, model.params_hash)

    @property
    def run_id(self) -> str:
        identity = [self.slice_id, self.model, self.model_version, self.params_hash]
        digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()
        return f"rp-{digest[:16]}"

    def directory(self, home: Path) -> Path:
        """`$SLUICE_HOME/replays/<slice>/<module.function>@<version>/params-<hash>/`."""
        version = self.model_version.replace(":", "-")
        params = self.params_hash.removeprefix("sha256:")[:16]
        slug = self.model.replace(":", ".")
        return home / "replays" / self.slice_id / f"{slug}@{version}" / f"params-{params}"


@dataclass(frozen=True, slots=True)
class ReplayResult:
    lineage: LineageRecord
    results: pa.Table
    metrics: dict[str, Any]


def write_json(path: Path, data: dict) -> Path:
    return durable.write_json(path, data, sort_keys=True, default=str)
