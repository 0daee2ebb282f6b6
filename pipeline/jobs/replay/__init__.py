"""Replays: run a model over exactly one slice of a stream's history, and record the lineage.

    result = replay(spark, store, slice_id, load_model("pipeline.models.nic:throughput"), ...)

The slice's segment ranges are read, flattened through the stream's schema and filtered to
the slice's sensor and time bounds in Spark tasks (`pipeline.spark.replay_reader`, the
export's way of reading); the driver merges their rows into one table in (event time, segment,
offset, sample) order and hands the model one pandas DataFrame of it; results, metrics and
lineage are written under a run id derived from the replay's identity: slice, model, code
version and a hash of the parameters (`ReplayKey`). Delivery: exactly-once per identity: a
re-run writes the same bytes to the same files, and different parameters never share a file.
The steps, the layout, and why pandas: `DESIGN.md`, "replay".

This module is the run (reading the slice, writing what it leaves) and the facade of its
parts: `model` (loading, binding and calling the model), `lineage` (a replay's identity and
record), `compare` (two replays side by side) and `errors`."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from pipeline import durable
from pipeline.jobs.replay.compare import RUN_KEYS, Comparison, compare
from pipeline.jobs.replay.errors import (
    BadLineageRecord,
    ModelError,
    OutputInUse,
    ReplayError,
    SliceSensorUnknown,
    SliceTruncated,
    UnknownSchema,
)
from pipeline.jobs.replay.lineage import (
    LINEAGE_VERSION,
    LineageRecord,
    ReplayKey,
    ReplayResult,
    write_json,
)
from pipeline.jobs.replay.model import (
    Model,
    canonical_value,
    hash_params_text,
    load_model,
    model_trace,
    params_text,
    run_model,
    takes_arrow,
)
from pipeline.jobs.slices import DEFAULT_SLICES_STREAM, SliceRecord, find_slice
from pipeline.outputs import check_writable, refused_writes

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from pipeline.schemas import FlattenPlan
    from pipeline.streams import StreamStore

__all__ = [
    "LINEAGE_VERSION",
    "RUN_KEYS",
    "BadLineageRecord",
    "Comparison",
    "LineageRecord",
    "Model",
    "ModelError",
    "OutputInUse",
    "ReplayError",
    "ReplayKey",
    "ReplayResult",
    "SliceSensorUnknown",
    "SliceTruncated",
    "UnknownSchema",
    "canonical_value",
    "check_readable",
    "check_sensor_by",
    "compare",
    "hash_params_text",
    "is_empty",
    "load_model",
    "model_trace",
    "output_directory",
    "params_text",
    "read_slice",
    "replay",
    "run_model",
    "spool_directory",
    "takes_arrow",
]

#: What running a replay again does after its disk refused a write (`OutputNotWritable`)
RERUN = "a replay is exactly-once per identity, so running it again writes the same files"

#: A replay's long steps, in order: reading the slice (told the bytes between its cuts),
#: running the model (the rows it gets), writing the results (the rows it returned).
ReplayStep = Literal["read", "model", "write"]
#: Told each step as it starts, with its count: how `sluice replay` shows its progress.
OnStep = Callable[[ReplayStep, int], None]


# --- reading the slice ----------------------------------------------------------------------


def check_readable(store: StreamStore, record: SliceRecord) -> None:
    """Raise `SliceTruncated` when a segment the slice reads was truncated past where the
    slice starts in it: a segment of its start cut, or one a scale created within the slice
    (which the start cut does not name: the slice reads it from offset 0)."""
    start, end = record.cuts
    heads = store.head(record.stream).segments
    for segment, first, stop in start.spans_until(end):
        head = heads.get(segment, 0)
        if head > first and stop != first:
            raise SliceTruncated(record.slice_id, record.stream, segment, first, head)


def check_sensor_by(record: SliceRecord, plan: FlattenPlan) -> None:
    """Raise `SliceSensorUnknown` when the slice names its sensor by columns (`sensor_by`)
    that the rows of `plan` lack: the Spark tasks would each fail on it (`sensor_names`)."""
    from pipeline.schemas.sensors import missing_columns

    if record.sensor is None or record.sensor_by in (None, "routing_key"):
        return
    columns = plan.arrow_schema.names
    missing = missing_columns(record.sensor_by, columns)
    if missing:
        raise SliceSensorUnknown(record.slice_id, record.sensor_by, missing, plan.name, columns)


def is_empty(record: SliceRecord) -> bool:
    """True when no byte of any segment lies between the slice's cuts."""
    start, end = record.cuts
    return all(stop <= first for _, first, stop in start.spans_until(end))


def read_slice(
    spark: SparkSession,
    store_uri: str,
    record: SliceRecord,
    plan: FlattenPlan,
    spool: Path | None = None,
    *,
    decode: bool = True,
) -> tuple[pa.Table, pa.Table, int]:
    """(rows of the sensor inside the time bounds, quarantined events, events between the
    cuts) of the slice, read, flattened and filtered in Spark tasks (`replay_reader`); with
    `spool`, a directory the executors and this process share, the rows come back through
    files there rather than through Spark (`spool_directory`).

    Rows carry the flattened columns, the lineage columns, `_time_ns` and `_routing_key`,
    sorted by (event time, segment, offset, sample); with `decode=False` the per-event
    columns stay dictionary-encoded (what an Arrow model gets). A slice of one routing key
    flattens only that key's events (the others are counted, not read further). An empty
    slice is not read at all (a bounded read of nothing has no partitions to plan)."""
    from pipeline.spark.replay_reader import (
        CHUNK_ARROW,
        CHUNK_SCHEMA,
        TASK_BYTES,
        SliceBounds,
        SliceReader,
        slice_rows,
    )
    from pipeline.spark.session import default_parallelism

    start, end = record.cuts
    if is_empty(record):
        return slice_rows(CHUNK_ARROW.empty_table(), plan)
    bounds = SliceBounds(record.sensor, record.sensor_by, record.start_time_ns, record.end_time_ns)
    # Twice as many tasks as cores (a slice of one key may live in a few segments) and few
    # enough bytes per task for its chunks to travel as one Arrow batch.
    tasks = max(2 * default_parallelism(spark), -(-start.bytes_until(end) // TASK_BYTES))
    ranges = (
        spark.read.format("sluice")
        .option("store", store_uri)
        .option("stream", record.stream)
        .option("startingCut", record.start_cut)
        .option("endingCut", record.end_cut)
        .option("emit", "ranges")
        .option("minPartitions", str(tasks))
        .load()
    )
    reader = SliceReader(plan, bounds, str(spool) if spool is not None else None)
    chunks = ranges.mapInArrow(reader, CHUNK_SCHEMA).toArrow()
    return slice_rows(chunks, plan, decode=decode)


#: Spool directories of replays killed before they removed them are removed after this long.
STALE_SPOOL_SECONDS = 3600


@contextlib.contextmanager
def spool_directory(spark: SparkSession, home: Path) -> Iterator[Path | None]:
    """A fresh directory under `$SLUICE_HOME/spool/` for the tasks' rows, removed afterwards,
    when the executors run on this machine (a `local` master, in this process or behind a
    Spark Connect server on loopback); else None (the rows travel through Spark)."""
    if not executors_share_files(spark):
        yield None
        return
    root = home / "spool"
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():  # left by a replay that was killed
        with contextlib.suppress(OSError):
            if time.time() - old.stat().st_mtime > STALE_SPOOL_SECONDS:
                shutil.rmtree(old)
    spool = Path(tempfile.mkdtemp(dir=root))
    try:
        yield spool
    finally:
        shutil.rmtree(spool, ignore_errors=True)
        with contextlib.suppress(OSError):
            root.rmdir()


def executors_share_files(spark: SparkSession) -> bool:
    """True when Spark's executors run on this machine, so see the files this process sees."""
    from pipeline.spark.session import is_remote

    if not is_remote(spark):
        return spark.sparkContext.master.startswith("local")
    host = str(getattr(spark.client, "host", ""))
    master = str(spark.conf.get("spark.master", "") or "")
    return host in ("localhost", "127.0.0.1", "::1") and master.startswith("local")


# --- the run --------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def output_directory(
    record: SliceRecord, model: Model, home: Path, output_dir: Path | None = None
) -> Path:
    """Where a replay of `record` through `model` writes (`output_dir`, else its identity's
    directory under `home`), refused when it holds another replay's files (`OutputInUse`) or
    cannot be written (`check_writable`): the command line asks before Spark starts."""
    key = ReplayKey.of(record.slice_id, model)
    output_dir = Path(output_dir or key.directory(home)).absolute()
    claim_output(output_dir, key.run_id)
    check_writable(output_dir)
    return output_dir


def claim_output(output_dir: Path, run_id: str) -> None:
    """Refuse a directory that holds another replay's lineage (`OutputInUse`), however it
    is spelled: a symbolic link to it, or a path through `..` whose first part does not
    exist yet (`other/../out`, where `out/lineage.json` is not found unresolved)."""
    existing = output_dir.resolve() / "lineage.json"
    if not existing.exists():
        return
    try:
        theirs = json.loads(existing.read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        theirs = None
    if theirs != run_id:
        raise OutputInUse(output_dir, str(theirs or "unknown"), run_id)


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
    on_step: OnStep | None = None,
) -> ReplayResult:
    """Replay one slice through one model (see the module doc); `on_step` is told each
    `ReplayStep` as it starts."""
    import pyarrow.parquet as pq

    started = _now()
    record = find_slice(store, slice_id, slices_stream)
    key = ReplayKey.of(record.slice_id, model)
    output_dir = output_directory(record, model, home, output_dir)
    check_readable(store, record)
    check_sensor_by(record, plan)
    step = on_step or (lambda _step, _count: None)
    start_cut, end_cut = record.cuts
    step("read", start_cut.bytes_until(end_cut))
    with spool_directory(spark, home) as spool:
        arrow = takes_arrow(model)
        rows, quarantined, between = read_slice(
            spark, store.uri, record, plan, spool, decode=not arrow
        )
    check_readable(store, record)  # truncated while reading: the read may have missed data
    step("model", rows.num_rows)
    results, model_metrics = run_model(model, rows)
    step("write", results.num_rows)
    with refused_writes(output_dir, RERUN):
        output_dir.mkdir(parents=True, exist_ok=True)
        results_path = output_dir / "results.parquet"
        with durable.atomic_path(results_path) as staging:
            pq.write_table(results, staging, compression="zstd")
        metrics = {
            "run_id": key.run_id,
            "slice_id": record.slice_id,
            "model": model.spec,
            "model_version": model.version,
            "params": model.params,
            "params_hash": key.params_hash,
            "input_events": between,
            "input_rows": rows.num_rows,
            "quarantined_events": quarantined.num_rows,
            "quarantine_reasons": sorted(set(quarantined["reason"].to_pylist())),
            "output_rows": results.num_rows,
            "model_metrics": model_metrics,
        }
        metrics_path = write_json(output_dir / "metrics.json", metrics)
        lineage = LineageRecord(
            run_id=key.run_id,
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
            params=model.params_text,
            params_hash=key.params_hash,
        )
        write_json(output_dir / "lineage.json", asdict(lineage))
    with refused_writes(home / "lineage", RERUN, "lineage directory"):
        lineage.write(home / "lineage")
    return ReplayResult(lineage, results, metrics)
