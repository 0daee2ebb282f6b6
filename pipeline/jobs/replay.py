"""Replays: run a model over exactly one slice of a stream's history, and record the lineage.

    result = replay(spark, store_uri, slice_id, "pipeline.models.nic:throughput")

A bounded Spark read between the slice's two cuts, flattened through the stream's schema on
the driver, filtered to the slice's sensor and time bounds, handed to the model as one pandas
DataFrame; results, metrics and lineage are written under a name derived from (slice, model,
version, params). Delivery: exactly-once per (slice, model, version, params): a re-run
writes the same bytes to the same files. The steps, and why pandas: `DESIGN.md`, "replay"."""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import durable
from pipeline.errors import SluiceError
from pipeline.jobs.slices import DEFAULT_SLICES_STREAM, SliceRecord, find_slice

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

    from pipeline.schemas import FlattenPlan
    from pipeline.streams import StreamStore

LINEAGE_VERSION = 1
ROW_TIME, ROW_KEY = "_time_ns", "_routing_key"


class ReplayError(SluiceError):
    """Base of the errors a replay raises on purpose."""


class SliceTruncated(ReplayError):
    def __init__(self, slice_id: str, stream: str, segment: int, start: int, head: int) -> None:
        self.slice_id, self.stream, self.segment = slice_id, stream, segment
        self.start, self.head = start, head
        msg = (
            f"slice {slice_id} cannot be replayed: {stream} segment {segment} was truncated at "
            f"offset {head}, past the slice's start {start}; its first events are gone. "
            "Replay a newer slice, or keep history longer (stream retention)"
        )
        super().__init__(msg)


class ModelError(ReplayError):
    def __init__(self, model: str, reason: str) -> None:
        self.model, self.reason = model, reason
        msg = f"model {model}: {reason}"
        super().__init__(msg)


class UnknownSchema(ReplayError):
    def __init__(self, stream: str) -> None:
        self.stream = stream
        msg = (
            f"no Avro schema is known for {stream}: pass --schema NAME (or a .avsc path), "
            "or add it to sluice.toml as [streams.NAME] stream/schema"
        )
        super().__init__(msg)


# --- records --------------------------------------------------------------------------------


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
    quarantined_events: int = 0
    params: str = "{}"
    version: int = LINEAGE_VERSION

    def write(self, lineage_dir: Path) -> Path:
        """Write (atomically replace) this run's record; return its path."""
        return _write_json(lineage_dir / f"{self.run_id}.json", asdict(self))


@dataclass(frozen=True, slots=True)
class Model:
    """A model named `module:function`, its code version and parameters."""

    spec: str
    function: Callable[..., Any]
    version: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return self.spec.replace(":", ".")


@dataclass(frozen=True, slots=True)
class ReplayResult:
    lineage: LineageRecord
    results: pa.Table
    metrics: dict[str, Any]


def _write_json(path: Path, data: dict) -> Path:
    return durable.write_json(path, data, sort_keys=True, default=str)


# --- the model ------------------------------------------------------------------------------


def load_model(spec: str, params: dict[str, Any] | None = None) -> Model:
    """Import `module:function`. Its version is the function's `version` attribute if it
    declares one, else `sha256:` of its module's source (any code change is a new version)."""
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise ModelError(spec, "name it as module:function, e.g. pipeline.models.nic:throughput")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(spec, f"cannot import {module_name} ({exc})") from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ModelError(spec, f"{module_name} has no function {name!r}")
    declared = getattr(function, "version", None)
    if declared is not None:
        version = str(declared)
    else:
        source = inspect.getsource(module).encode()
        version = "sha256:" + hashlib.sha256(source).hexdigest()[:16]
    return Model(spec, function, version, dict(params or {}))


def run_model(model: Model, frame: pd.DataFrame) -> tuple[pa.Table, dict[str, Any]]:
    """Call the model; its results as an Arrow table (no pandas index) and its metrics."""
    import pandas as pd

    out = model.function(frame, **model.params)
    results, metrics = out if isinstance(out, tuple) else (out, {})
    if not isinstance(results, pd.DataFrame) or not isinstance(metrics, dict):
        got = f"{type(results).__name__}, {type(metrics).__name__}"
        reason = f"must return a pandas DataFrame or (DataFrame, dict), not ({got})"
        raise ModelError(model.spec, reason)
    table = pa.Table.from_pandas(results.reset_index(drop=True), preserve_index=False)
    return table.replace_schema_metadata(None), metrics


# --- reading the slice ----------------------------------------------------------------------


def check_readable(store: StreamStore, record: SliceRecord) -> None:
    """Raise `SliceTruncated` when any segment's head is past the slice's start cut."""
    start, end = record.cuts
    heads = store.head(record.stream).segments
    for segment, offset in start.positions:
        head = heads.get(segment, 0)
        if head > offset and end.offset(segment) != offset:
            raise SliceTruncated(record.slice_id, record.stream, segment, offset, head)


def read_events(spark: SparkSession, store_uri: str, record: SliceRecord) -> tuple[pa.Table, int]:
    """The slice's events (rows of the `sluice` source) on the driver, in stream order, and
    how many events lie between the cuts. A slice of one routing key is filtered in Spark,
    before anything travels to the driver; the count is of every event read."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    events = (
        spark.read.format("sluice")
        .option("store", store_uri)
        .option("stream", record.stream)
        .option("startingCut", record.start_cut)
        .option("endingCut", record.end_cut)
        .load()
    )
    observed = Observation("slice")
    events = events.observe(observed, F.count(F.lit(1)).alias("events"))
    if record.sensor is not None and record.sensor_by in (None, "routing_key"):
        events = events.filter(F.col("routing_key") == record.sensor)
    table = events.toArrow().sort_by([("segment", "ascending"), ("offset", "ascending")])
    return table, int(observed.get.get("events", 0))


def _sensor_mask(rows: pa.Table, keys: pa.Array, record: SliceRecord) -> pa.Array | None:
    if record.sensor is None:
        return None
    if record.sensor_by in (None, "routing_key"):
        return pc.equal(keys, record.sensor)
    columns = [c.strip() for c in record.sensor_by.split(",")]
    parts = [pc.cast(rows[c], pa.string()) for c in columns]
    return pc.equal(pc.binary_join_element_wise(*parts, "/"), record.sensor)


def _event_of_rows(events: pa.Table, rows: pa.Table) -> pa.Array:
    """For each flattened row, the index of its event (events sorted by segment, offset)."""
    seg_e = events["segment"].to_numpy().astype(np.int64)
    off_e = events["offset"].to_numpy().astype(np.int64)
    seg_r = rows["_segment"].to_numpy().astype(np.int64)
    off_r = rows["_offset"].to_numpy().astype(np.int64)
    span = int(off_e.max()) + 1 if len(off_e) else 1
    key_e, key_r = seg_e * span + off_e, seg_r * span + off_r
    return pa.array(np.searchsorted(key_e, key_r), pa.int64())


def flatten_slice(
    events: pa.Table, record: SliceRecord, plan: FlattenPlan
) -> tuple[pa.Table, pa.Table]:
    """(rows of the sensor inside the time bounds, quarantined events) of the slice's events.

    Rows carry the flattened columns, the lineage columns, `_time_ns` and `_routing_key`,
    sorted by (event time, segment, offset, sample)."""
    from pipeline.schemas import Events, flatten

    out = flatten(plan, Events.from_arrow(events))
    rows = out.rows.append_column(ROW_TIME, pa.array(out.time_ns, pa.int64()))
    keys = events["routing_key"].take(_event_of_rows(events, rows))
    rows = rows.append_column(ROW_KEY, keys)
    times = rows[ROW_TIME]
    keep = pc.and_(
        pc.greater_equal(times, record.start_time_ns), pc.less_equal(times, record.end_time_ns)
    )
    sensor = _sensor_mask(rows, keys, record)
    if sensor is not None:
        keep = pc.and_(keep, sensor)
    rows = rows.filter(keep)
    # Rows are in stream order (segment, offset, sample); a stable sort by time keeps it
    # among equal times: (event time, segment, offset, sample).
    order = np.argsort(rows[ROW_TIME].to_numpy(), kind="stable")
    rows = rows.take(pa.array(order))
    bad = out.quarantine.sort_by([("_segment", "ascending"), ("_offset", "ascending")])
    return rows, bad


# --- the run --------------------------------------------------------------------------------


def run_id(record: SliceRecord, model: Model) -> str:
    identity = [record.slice_id, model.spec, model.version, model.params]
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    return f"rp-{digest[:16]}"


def default_output_dir(home: Path, record: SliceRecord, model: Model) -> Path:
    version = model.version.replace(":", "-")
    return home / "replays" / record.slice_id / f"{model.slug}@{version}"


def _now() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def replay(
    spark: SparkSession,
    store: StreamStore,
    slice_id: str,
    model: Model,
    *,
    plan: FlattenPlan,
    home: Path,
    output_dir: Path | None = None,
    slices_stream: str = DEFAULT_SLICES_STREAM,
) -> ReplayResult:
    """Replay one slice through one model (see the module doc)."""
    import pyarrow.parquet as pq

    started = _now()
    record = find_slice(store, slice_id, slices_stream)
    check_readable(store, record)
    events, between = read_events(spark, store.uri, record)
    check_readable(store, record)  # truncated while reading: the read may have missed data
    rows, quarantined = flatten_slice(events, record, plan)
    results, model_metrics = run_model(model, rows.to_pandas())
    output_dir = Path(output_dir or default_output_dir(home, record, model)).absolute()
    output_dir.mkdir(parents=True, exist_ok=True)
    results_path = output_dir / "results.parquet"
    with durable.atomic_path(results_path) as staging:
        pq.write_table(results, staging, compression="zstd")
    metrics = {
        "slice_id": record.slice_id,
        "model": model.spec,
        "model_version": model.version,
        "params": model.params,
        "input_events": between,
        "input_rows": rows.num_rows,
        "quarantined_events": quarantined.num_rows,
        "quarantine_reasons": sorted(set(quarantined["reason"].to_pylist())),
        "output_rows": results.num_rows,
        "model_metrics": model_metrics,
    }
    metrics_path = _write_json(output_dir / "metrics.json", metrics)
    lineage = LineageRecord(
        run_id=run_id(record, model),
        slice_id=record.slice_id,
        stream=record.stream,
        sensor=record.sensor,
        start_cut=record.start_cut,
        end_cut=record.end_cut,
        start_time_ns=record.start_time_ns,
        end_time_ns=record.end_time_ns,
        input_events=between,
        input_rows=rows.num_rows,
        output_rows=results.num_rows,
        model=model.spec,
        model_version=model.version,
        output_dir=str(output_dir),
        results_path=str(results_path),
        metrics_path=str(metrics_path),
        started_at=started,
        finished_at=_now(),
        quarantined_events=quarantined.num_rows,
        params=json.dumps(model.params, sort_keys=True),
    )
    _write_json(output_dir / "lineage.json", asdict(lineage))
    lineage.write(home / "lineage")
    return ReplayResult(lineage, results, metrics)


# --- comparing two replays ------------------------------------------------------------------


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
        same_metrics = all(x == y for name, x, y in self.metrics if name not in _RUN_KEYS)
        return same_metrics and not (self.only_a or self.only_b or self.columns_differ)

    def as_dict(self) -> dict[str, Any]:
        return {
            "slice_id": self.slice_id,
            "a": {"model": self.a.model, "version": self.a.model_version, "run": self.a.run_id},
            "b": {"model": self.b.model, "version": self.b.model_version, "run": self.b.run_id},
            "identical": self.identical,
            "metrics": [{"metric": n, "a": x, "b": y} for n, x, y in self.metrics],
            "columns_differ": self.columns_differ,
            "rows_only_in_a": self.only_a,
            "rows_only_in_b": self.only_b,
            "sample_only_in_a": self.sample_a,
            "sample_only_in_b": self.sample_b,
        }


_RUN_KEYS = ("model", "model_version", "params")


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
