"""Replays: run a model over exactly one slice of a stream's history, and record the lineage.

    result = replay(spark, store, slice_id, load_model("pipeline.models.nic:throughput"), ...)

The slice's segment ranges are read, flattened through the stream's schema and filtered to
the slice's sensor and time bounds in Spark tasks (`pipeline.spark.replay_reader`, the
export's way of reading); the driver merges their rows into one table in (event time, segment,
offset, sample) order and hands the model one pandas DataFrame of it; results, metrics and
lineage are written under a run id derived from the replay's identity: slice, model, code
version and a hash of the parameters (`ReplayKey`). Delivery: exactly-once per identity: a
re-run writes the same bytes to the same files, and different parameters never share a file.
The steps, the layout, and why pandas: `DESIGN.md`, "replay"."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import inspect
import json
import math
import shutil
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_origin

import pyarrow as pa

from pipeline import durable
from pipeline.errors import SluiceError
from pipeline.jobs.slices import DEFAULT_SLICES_STREAM, SliceRecord, find_slice
from pipeline.outputs import check_writable, refused_writes

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

    from pipeline.schemas import FlattenPlan
    from pipeline.streams import StreamStore

LINEAGE_VERSION = 2
#: lineage records this Sluice reads: version 1 had no `params_hash` (it is computed from
#: `params`, which version 1 already wrote in the canonical form)
READABLE_LINEAGE_VERSIONS = (1, 2)
#: What running a replay again does after its disk refused a write (`OutputNotWritable`)
RERUN = "a replay is exactly-once per identity, so running it again writes the same files"

#: A replay's long steps, in order: reading the slice (told the bytes between its cuts),
#: running the model (the rows it gets), writing the results (the rows it returned).
ReplayStep = Literal["read", "model", "write"]
#: Told each step as it starts, with its count: how `sluice replay` shows its progress.
OnStep = Callable[[ReplayStep, int], None]


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
    """A model that cannot be loaded or run, or whose results cannot be kept; `trace` is the
    traceback of the model's own code (Sluice's frames left out) when its code raised."""

    def __init__(self, model: str, reason: str, trace: str = "") -> None:
        self.model, self.reason, self.trace = model, reason, trace
        msg = f"model {model}: {reason}" + (f"\n{trace}" if trace else "")
        super().__init__(msg)


class OutputInUse(ReplayError):
    """`--output` names a directory that holds another replay's files."""

    def __init__(self, output_dir: Path, theirs: str, ours: str) -> None:
        self.output_dir, self.theirs, self.ours = output_dir, theirs, ours
        msg = (
            f"{output_dir} holds the files of replay {theirs}, not of this one ({ours}): a "
            "replay never overwrites another's results; choose another --output, or leave it "
            "out (each replay then gets its own directory under $SLUICE_HOME/replays)"
        )
        super().__init__(msg)


class BadLineageRecord(ReplayError, ValueError):
    """A lineage file this Sluice cannot read (another version, or not a lineage record)."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path, self.reason = str(path), reason
        msg = f"lineage record {path}: {reason} (was it written by a newer Sluice?)"
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
        return _write_json(lineage_dir / f"{self.run_id}.json", asdict(self))

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
class Model:
    """A model named `module:function`, its code version and parameters: every keyword it
    takes, the defaults of its signature included (so leaving out a default and passing it
    are the same replay)."""

    spec: str
    function: Callable[..., Any]
    version: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return self.spec.replace(":", ".")

    @property
    def params_text(self) -> str:
        """The parameters as canonical JSON (sorted keys): what `params_hash` hashes."""
        return params_text(self.params)

    @property
    def params_hash(self) -> str:
        return hash_params_text(self.params_text)


def params_text(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def hash_params_text(text: str) -> str:
    """`sha256:<64 hex>` of the canonical parameter text."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


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
        with contextlib.redirect_stdout(sys.stderr):  # standard output is the command's
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(spec, f"cannot import {module_name} ({exc})") from None
    except Exception as exc:  # the module's own code: a syntax error, a raise at import
        reason = f"importing {module_name} raised {_described(exc)}"
        raise ModelError(spec, reason, model_trace(exc)) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ModelError(spec, f"{module_name} has no function {name!r}")
    declared = getattr(function, "version", None)
    if declared is not None:
        version = str(declared)
    else:
        source = inspect.getsource(module).encode()
        version = "sha256:" + hashlib.sha256(source).hexdigest()[:16]
    return Model(spec, function, version, _bind_params(spec, function, dict(params or {})))


def _bind_params(spec: str, function: Callable[..., Any], params: dict[str, Any]) -> dict:
    """The keywords the model will get: `params`, each as the type the function expects
    (`canonical_value`), plus its signature's defaults."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C function: take the params as given
        return params
    with contextlib.suppress(Exception):  # annotations as types, where they evaluate here
        signature = inspect.signature(function, eval_str=True)
    positional = {inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD}
    positional.add(inspect.Parameter.VAR_POSITIONAL)
    if not any(p.kind in positional for p in signature.parameters.values()):
        reason = "takes no argument for the slice's rows: a model is function(frame, **params)"
        raise ModelError(spec, reason)
    params = {
        name: canonical_value(spec, signature.parameters[name], value)
        if name in signature.parameters
        else value
        for name, value in params.items()
    }
    try:
        bound = signature.bind(None, **params)
    except TypeError as exc:
        names = [p for p in list(signature.parameters)[1:]]
        reason = f"parameters {sorted(params)} do not fit it ({exc}; it takes {names})"
        raise ModelError(spec, reason) from None
    bound.apply_defaults()
    first = next(iter(signature.parameters))
    effective: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if name == first:
            continue
        if kind is inspect.Parameter.VAR_KEYWORD:
            effective.update(value)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            effective[name] = value
    return effective


def canonical_value(spec: str, parameter: inspect.Parameter, value: Any) -> Any:
    """`value` as the type of `parameter`'s default (else of its annotation, `float | None`),
    so that equal values are one replay: `995` for a float is `995.0`, `3.0` for an int is
    `3`, a whole number for text is its digits. A value that is not of that type, or would
    change in the conversion (`3.5` for an int, `true` for a number), is a `ModelError`
    naming the parameter and the type. Parameters of other types are taken as given."""
    default = parameter.default
    if default is not inspect.Parameter.empty and default is not None:
        kinds = (type(default),)
    else:
        annotation = parameter.annotation
        union = isinstance(annotation, types.UnionType) or get_origin(annotation) is Union
        kinds = tuple(annotation.__args__) if union else (annotation,)
        kinds = tuple(None if kind is type(None) else kind for kind in kinds)
        if value is None and (default is None or None in kinds):
            return None
    if type(value) in kinds:
        return value
    for kind in (bool, int, float, str):
        if kind not in kinds:
            continue
        converted = _converted(kind, value)
        if converted is not _UNCONVERTIBLE:
            return converted
    if not any(kind in kinds for kind in (bool, int, float, str)):
        return value
    wanted = " or ".join(_TYPE_NAMES[k] for k in (bool, int, float, str, None) if k in kinds)
    reason = f"parameter {parameter.name}={value!r} is not {wanted}"
    if default is not inspect.Parameter.empty:
        reason += f" (its default is {default!r})"
    raise ModelError(spec, reason)


_UNCONVERTIBLE = object()
_TYPE_NAMES = {
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    str: "text",
    None: "null",
}


def _converted(kind: type, value: Any) -> Any:
    """`value` as `kind` when that changes nothing but its type; else `_UNCONVERTIBLE`."""
    if kind is bool or isinstance(value, bool):  # a bool is an int to Python, not to a model
        return value if kind is bool and isinstance(value, bool) else _UNCONVERTIBLE
    if kind is float and isinstance(value, int):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if kind is str and isinstance(value, int):  # `--model m,name=123`: JSON made it a number
        return str(value)
    return _UNCONVERTIBLE


def takes_arrow(model: Model) -> bool:
    """True when the model declares `takes_arrow = True`: it is handed the slice's rows as
    a `pyarrow.Table` rather than a pandas DataFrame (`pipeline.models`)."""
    return getattr(model.function, "takes_arrow", False) is True


def run_model(model: Model, rows: pa.Table | pd.DataFrame) -> tuple[pa.Table, dict[str, Any]]:
    """Call the model on the rows: a pandas model gets a DataFrame (dictionary columns
    decoded), an Arrow model (`takes_arrow`) the table, or the DataFrame it is given; one
    that returns `NotImplemented` for a table is called again with its DataFrame. What it
    prints goes to standard error (standard output is the command's). Returns its results
    as an Arrow table (no pandas index, no schema metadata) and its metrics as JSON values;
    a model that raises, or returns what a replay cannot keep, is a `ModelError`."""
    from pipeline.spark.replay_reader import decoded

    with contextlib.redirect_stdout(sys.stderr):
        out = NotImplemented
        if isinstance(rows, pa.Table) and takes_arrow(model):
            out = _call(model, rows)
        if out is NotImplemented:
            frame = decoded(rows).to_pandas() if isinstance(rows, pa.Table) else rows
            out = _call(model, frame)
    results, metrics = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
    return _results_table(model.spec, results, metrics), _json_metrics(model.spec, metrics)


#: Columns the analytics `replays` view adds to each result row (from its lineage record,
#: and DuckDB's `filename`): a model's results cannot have columns of these names.
VIEW_COLUMNS = ("run_id", "slice_id", "model", "model_version", "params_hash", "filename")


def _call(model: Model, rows: pa.Table | pd.DataFrame) -> Any:
    try:
        return model.function(rows, **model.params)
    except (Exception, SystemExit) as exc:  # `sys.exit()` in a model ends no replay silently
        raise ModelError(model.spec, f"raised {_described(exc)}", model_trace(exc)) from None


def _results_table(spec: str, results: Any, metrics: Any) -> pa.Table:
    """The model's results as an Arrow table a Parquet file and the `replays` view hold."""
    import pandas as pd

    if not isinstance(results, pd.DataFrame | pa.Table) or not isinstance(metrics, dict):
        got = f"({type(results).__name__}, {type(metrics).__name__})"
        reason = f"must return a pandas DataFrame or pyarrow Table, or (that, dict), not {got}"
        raise ModelError(spec, reason)
    if isinstance(results, pd.DataFrame):
        try:
            results = pa.Table.from_pandas(results.reset_index(drop=True), preserve_index=False)
        except (pa.ArrowException, ValueError) as exc:
            found = "; ".join(map(str, exc.args))  # pyarrow: (what failed, in which column)
            reason = f"its results cannot be written as Parquet ({found}): give each column "
            raise ModelError(spec, reason + "one type, and unique names") from None
    names = results.schema.names
    if not names:
        reason = (
            "returned a table without columns: an empty result is its columns without rows, "
            "e.g. pd.DataFrame(columns=[...])"
        )
        raise ModelError(spec, reason)
    if clashing := sorted({n for n in names if n in VIEW_COLUMNS or names.count(n) > 1}):
        reason = (
            f"its results have columns {clashing}, which are repeated or named as the "
            f"`replays` view's own ({', '.join(VIEW_COLUMNS)}): rename them"
        )
        raise ModelError(spec, reason)
    if "time" in names and not _is_time(results.schema.field("time").type):
        reason = (
            f"its `time` column holds {results.schema.field('time').type}, not timestamps: the "
            "`replays` view reads it as each result's time. Give it timestamps (e.g. "
            "pd.to_datetime(frame._time_ns, utc=True)) or another name"
        )
        raise ModelError(spec, reason)
    return results.replace_schema_metadata(None)


def _is_time(arrow_type: pa.DataType) -> bool:
    return pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type)


def _json_metrics(spec: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """The metrics as the JSON values `metrics.json` holds (numpy numbers as Python's). JSON
    has no NaN or infinity: such a metric (a mean of no rows) is kept as null, and standard
    error names it."""

    import numpy as np

    def plain(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        msg = f"a {type(value).__name__}: {value!r}"
        raise TypeError(msg)

    try:
        values = json.loads(json.dumps(metrics, default=plain))
    except (TypeError, ValueError) as exc:
        reason = f"its metrics hold a value that is not JSON ({exc}): return numbers, text, "
        raise ModelError(spec, reason + "true/false, null, and lists and dicts of them") from None
    nulled: list[tuple[str, str]] = []
    values = _finite(values, "", nulled)
    if nulled:
        named = ", ".join(f"{where} ({value})" for where, value in nulled)
        print(
            f"model {spec}: metrics kept as null (JSON has no NaN or infinity): {named}",
            file=sys.stderr,
        )
    return values


def _finite(value: Any, where: str, nulled: list[tuple[str, str]]) -> Any:
    """`value` with each NaN or infinite float replaced by None, its place noted in `nulled`."""
    if isinstance(value, float) and not math.isfinite(value):
        nulled.append((where, repr(value)))
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{where}.{k}" if where else k, nulled) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v, f"{where}[{i}]", nulled) for i, v in enumerate(value)]
    return value


def _described(exc: BaseException) -> str:
    """`Type: first line of the message`: an exception on one line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def model_trace(exc: BaseException) -> str:
    """The traceback of `exc` from the model's own code on: the frames of Sluice's call and
    of Python's import machinery left out (a syntax error keeps its file, line and caret)."""
    tb = exc.__traceback__
    while tb is not None and _not_the_models(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


def _not_the_models(filename: str) -> bool:
    return filename in (__file__, importlib.__file__) or filename.startswith("<frozen ")


# --- reading the slice ----------------------------------------------------------------------


def check_readable(store: StreamStore, record: SliceRecord) -> None:
    """Raise `SliceTruncated` when a segment the slice reads was truncated past where the
    slice starts in it: a segment of its start cut, or one a scale created within the slice
    (which the start cut does not name: the slice reads it from offset 0)."""
    start, end = record.cuts
    heads = store.head(record.stream).segments
    begin, finish = start.segments, end.segments
    for segment in sorted(begin.keys() | finish.keys()):
        first, stop = begin.get(segment, 0), finish.get(segment)
        head = heads.get(segment, 0)
        if head > first and stop != first:
            raise SliceTruncated(record.slice_id, record.stream, segment, first, head)


def is_empty(record: SliceRecord) -> bool:
    """True when no byte of any segment lies between the slice's cuts."""
    start, end = record.cuts
    begin = start.segments
    return all(offset <= begin.get(segment, 0) for segment, offset in end.positions)


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
    """Refuse a directory that holds another replay's lineage (`OutputInUse`)."""
    existing = output_dir / "lineage.json"
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
        metrics_path = _write_json(output_dir / "metrics.json", metrics)
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
        _write_json(output_dir / "lineage.json", asdict(lineage))
    with refused_writes(home / "lineage", RERUN, "lineage directory"):
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
