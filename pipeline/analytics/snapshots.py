"""Snapshots the analytics views read: the slices of every configured store and the replay
lineage, as Parquet files under `$SLUICE_HOME/analytics/` (atomic replace).

Slices live in streams and lineage in one JSON file per replay; neither is something DuckDB
can glob, so a refresh (`catalog.refresh`, `sluice analytics refresh`, the Dagster analytics
asset) turns them into one Parquet file each, with every time as a UTC timestamp beside the
exact nanoseconds. A query never takes a snapshot: reading never writes (`DESIGN.md`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline import durable

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.analytics.sources import AnalyticsPaths
    from pipeline.jobs.replay import LineageRecord
    from pipeline.jobs.slices import SliceRecord
    from pipeline.settings import SluiceSettings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _segment_type() -> pa.DataType:
    import pyarrow as pa

    return pa.struct(
        [("segment", pa.int64()), ("start_offset", pa.int64()), ("end_offset", pa.int64())]
    )


def _write_parquet(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    with durable.atomic_path(path) as staging:
        pq.write_table(table, staging)


def _utc(ns: int) -> datetime:
    """Nanoseconds since the epoch as a UTC datetime (to the microsecond, rounded down)."""
    return EPOCH + timedelta(microseconds=ns // 1000)


def _bounds(record: SliceRecord | LineageRecord) -> dict[str, Any]:
    """A slice's cuts and times, as the `slices` and `lineage` snapshots hold them."""
    return {
        "start_time": _utc(record.start_time_ns),
        "end_time": _utc(record.end_time_ns),
        "start_time_ns": record.start_time_ns,
        "end_time_ns": record.end_time_ns,
        "start_cut": record.start_cut,
        "end_cut": record.end_cut,
    }


def snapshot_slices(paths: AnalyticsPaths, found: Iterable[tuple[SliceRecord, str]]) -> int:
    """Write the slices, (record, the slices stream it was read from) pairs, as the Parquet
    file the `slices` view reads (atomic replace); each slice once; `start_time`/`end_time` as
    UTC timestamps next to the exact nanoseconds. Returns how many slices it holds."""
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema(
        [
            ("slice_id", pa.string()),
            ("stream", pa.string()),
            ("sensor", pa.string()),
            ("sensor_by", pa.string()),
            ("time", ts),
            ("start_time", ts),
            ("end_time", ts),
            ("start_time_ns", pa.int64()),
            ("end_time_ns", pa.int64()),
            ("start_cut", pa.string()),
            ("end_cut", pa.string()),
            ("segments", pa.list_(_segment_type())),
            ("reason", pa.string()),
            ("created_by", pa.string()),
            ("slices_stream", pa.string()),
            ("version", pa.int64()),
        ]
    )
    rows: dict[str, dict] = {}
    for record, slices_stream in found:
        if record.slice_id in rows:
            continue
        start, end = record.cuts
        begin = start.segments
        segments = [
            {"segment": seg, "start_offset": begin.get(seg, 0), "end_offset": off}
            for seg, off in end.positions
        ]
        rows[record.slice_id] = {
            "slice_id": record.slice_id,
            "stream": record.stream,
            "sensor": record.sensor,
            "sensor_by": record.sensor_by,
            "time": _utc(record.start_time_ns),
            **_bounds(record),
            "segments": segments,
            "reason": record.reason,
            "created_by": record.created_by,
            "slices_stream": slices_stream,
            "version": record.version,
        }
    _write_parquet(paths.slices_snapshot, list(rows.values()), schema)
    return len(rows)


def results_current(record: LineageRecord) -> bool:
    """Whether the record's results file still holds its rows: the `metrics.json` beside it
    names the same run (or, before run ids were in metrics, the same model and parameters)."""
    results, metrics = Path(record.results_path), Path(record.metrics_path)
    if not results.exists() or not metrics.exists():
        return False
    try:
        written = json.loads(metrics.read_text())
    except (OSError, ValueError):
        return False
    if "run_id" in written:
        return written["run_id"] == record.run_id
    same = (written.get("model"), written.get("model_version")) == (
        record.model,
        record.model_version,
    )
    return same and json.dumps(written.get("params", {}), sort_keys=True) == record.params


def snapshot_lineage(paths: AnalyticsPaths) -> list[dict]:
    """Read every lineage record (of any readable version) and write the Parquet file the
    `lineage` view reads; return its rows."""
    import pyarrow as pa

    from pipeline.jobs.replay import LineageRecord

    ts = pa.timestamp("us", tz="UTC")
    text, number = pa.string(), pa.int64()
    schema = pa.schema(
        [
            *((n, text) for n in ("run_id", "slice_id", "stream", "sensor", "model")),
            ("model_version", text),
            ("params", text),
            ("params_hash", text),
            *((n, ts) for n in ("time", "started_at", "finished_at", "start_time", "end_time")),
            ("start_time_ns", number),
            ("end_time_ns", number),
            ("start_cut", text),
            ("end_cut", text),
            *((n, number) for n in ("input_events", "input_rows", "quarantined_events")),
            ("output_rows", number),
            ("output_dir", text),
            ("results_file", text),
            ("metrics_file", text),
            ("results_current", pa.bool_()),
            ("version", number),
        ]
    )
    rows = []
    files = sorted(paths.lineage_dir.glob("*.json")) if paths.lineage_dir.is_dir() else []
    for path in files:
        record = LineageRecord.read(path)
        started = datetime.fromisoformat(record.started_at)
        rows.append(
            {
                **{k: getattr(record, k) for k in ("run_id", "slice_id", "stream", "sensor")},
                "model": record.model,
                "model_version": record.model_version,
                "params": record.params,
                "params_hash": record.params_hash,
                "time": started,
                "started_at": started,
                "finished_at": datetime.fromisoformat(record.finished_at),
                **_bounds(record),
                "input_events": record.input_events,
                "input_rows": record.input_rows,
                "quarantined_events": record.quarantined_events,
                "output_rows": record.output_rows,
                "output_dir": paths.stored(record.output_dir),
                "results_file": paths.stored(record.results_path),
                "metrics_file": paths.stored(record.metrics_path),
                "results_current": results_current(record),
                "version": record.version,
            }
        )
    _write_parquet(paths.lineage_snapshot, rows, schema)
    return rows


# --- the slices of every configured store -------------------------------------------------


def collect_slices(
    settings: SluiceSettings, store: str | None = None, slices_stream: str | None = None
) -> list[tuple[SliceRecord, str]]:
    """Every slice of every store of sluice.toml (plus `store`), from the default slices
    stream, each bookmark's and `slices_stream`: (record, the slices stream it came from).

    A store that is not there yet (an embedded directory never written) holds none; a store
    that cannot be read fails the refresh, so that the snapshot never loses slices."""
    from pipeline.jobs.slices import DEFAULT_SLICES_STREAM, list_slices
    from pipeline.streams import open_store

    streams = [DEFAULT_SLICES_STREAM, slices_stream]
    streams += [f.bookmark.slices_stream for f in settings.streams if f.bookmark is not None]
    uris = [*settings.stores.values(), store]
    found: list[tuple[SliceRecord, str]] = []
    for uri in dict.fromkeys(u for u in uris if u):
        scheme, _, directory = uri.partition(":")
        if scheme == "embedded" and directory and not Path(directory).is_dir():
            continue
        with open_store(uri) as opened:
            for name in dict.fromkeys(s for s in streams if s):
                found += [(r, name) for r in list_slices(opened, None, name)]
    return found
