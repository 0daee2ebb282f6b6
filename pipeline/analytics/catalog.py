"""The analysts' DuckDB database: views over every file Sluice writes, rebuilt by `refresh`.

    duckdb.connect("/home/me/.sluice/analytics/sluice.duckdb").sql("SELECT * FROM rates LIMIT 5")

The file holds views only (no copied data), so it stays small and opens in plain `duckdb`
with no Sluice import. `refresh` (run by `sluice analytics refresh` and the Dagster analytics
asset, never by a query) snapshots the slices and the replay lineage to Parquet and
(re)creates the views: one per export and per export kind, `samples`, `rates`, `quarantine`,
`slices`, `slice_rows`, `lineage`, `replays` and `sources`, each with a `time TIMESTAMPTZ`
column and a comment on the view and every column. `rates` scans the rates table the refresh
brings up to date first (`rates_table.py`). Paths under the Sluice home go through
the `sluice_path()` macro, so a copy of the home opens with one setting. Each view:
`DESIGN.md`, "Views"."""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from pipeline import durable
from pipeline.analytics import comments
from pipeline.analytics.rates import NIC_COLUMNS, rates_sql
from pipeline.analytics.rates_table import RatesTable, RatesUpdate, stale_tables, sweep
from pipeline.analytics.snapshots import snapshot_lineage, snapshot_slices
from pipeline.analytics.sources import (
    CATALOG_VERSION,
    PARTITIONS,
    AnalyticsError,
    AnalyticsPaths,
    ExportSource,
    UnreadableExportFiles,
    check_database,
    unreadable_files,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.schemas import FlattenPlan

NIC_KIND = "network_samples"

#: The export's hive partitions and their SQL types (`date=2026-11-01/hour=04`).
PARTITION_COLUMNS = {"date": "DATE", "hour": "BIGINT"}
PARTITION_TYPES = ", ".join(f"'{name}': {kind}" for name, kind in PARTITION_COLUMNS.items())


def sql_str(value: str | Path) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _empty(columns: dict[str, str]) -> str:
    cols = ", ".join(f"NULL::{sql_type} AS {ident(name)}" for name, sql_type in columns.items())
    return f"SELECT {cols} WHERE false"


def _kind_view(schema_name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", schema_name).lower()


# --- the views ----------------------------------------------------------------------------


@dataclass(slots=True)
class _View:
    sql: str
    comment: str
    columns: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Source:
    kind: str
    name: str
    directory: str
    files: int


@dataclass(slots=True)
class _Builder:
    """Collects the views of one refresh, in the order they must be created."""

    paths: AnalyticsPaths
    con: duckdb.DuckDBPyConnection
    views: dict[str, _View] = field(default_factory=dict)
    sources: list[_Source] = field(default_factory=list)
    #: the rates table of each NIC export with files: (export, its table after this refresh)
    rates: list[tuple[ExportSource, RatesUpdate]] = field(default_factory=list)
    log: Callable[[str], None] | None = None

    def path(self, stored: str) -> str:
        return f"sluice_path({sql_str(stored)})"

    def glob(self, path: Path | str, files: str = "") -> str:
        """What a view reads: `files` under `path`, or the file `path` (`paths.pattern`)."""
        return f"sluice_glob({sql_str(self.paths.pattern(path, files))})"

    def columns(self, sql: str) -> list[str]:
        return [row[0] for row in self.con.execute(f"DESCRIBE {sql}").fetchall()]

    def taken(self, name: str) -> str | None:
        """The view already named `name` as DuckDB compares names (without case), if any."""
        return next((v for v in self.views if v.lower() == name.lower()), None)

    def add(self, name: str, sql: str, comment: str, docs: dict[str, str]) -> None:
        if (other := self.taken(name)) is not None:  # it would replace that view, silently
            same = f"{name!r} twice" if other == name else f"{other!r} and {name!r}"
            reason = (
                f"two views would be named {same} (DuckDB ignores case in names), and one "
                "would hide the other's rows: give one of the exports another name"
            )
            msg = f"cannot build the views of {self.paths.database}"
            raise AnalyticsError(msg, reason)
        self.views[name] = _View(sql, comment)
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS {sql}")
        for column in self.columns(f"SELECT * FROM {ident(name)}"):
            self.views[name].columns[column] = docs.get(column, "")


def _schema_docs(plan: FlattenPlan) -> dict[str, str]:
    parsed = plan.schema.parsed
    found = parsed.get("fields", []) if isinstance(parsed, dict) else []
    return {f["name"]: f.get("doc", "") for f in found if isinstance(f, dict)}


def _plan_of(source: ExportSource, columns: list[str]) -> FlattenPlan | None:
    """The export's flatten plan: of its schema, else of the bundled schema its columns fit."""
    from pipeline.schemas import bundled_schemas, flatten_plan

    if source.schema is not None:
        return flatten_plan(source.schema, source.time_field)
    for name in bundled_schemas():
        plan = flatten_plan(name)
        if columns and {c.name for c in plan.columns} <= set(columns):
            return plan
    return None


_DUCK_TYPES = {"int64": "BIGINT", "int32": "INTEGER", "double": "DOUBLE", "float": "FLOAT"}
_DUCK_TYPES |= {"string": "VARCHAR", "bool": "BOOLEAN", "binary": "BLOB", "large_string": "VARCHAR"}


def _typed(schema: pa.Schema) -> dict[str, str]:
    return {f.name: _DUCK_TYPES.get(str(f.type), "VARCHAR") for f in schema}


def _time_expr(plan: FlattenPlan | None, columns: list[str]) -> str:
    if plan is None or plan.time is None or plan.time.name not in columns:
        return "NULL::TIMESTAMPTZ"
    ns = f"({ident(plan.time.name)} * {plan.time.ns_per_unit})"
    # microseconds rounded down, as the hour partitions are (DuckDB's `//` rounds toward 0:
    # -1 ns would show as 1970-01-01 00:00, in the partition of 1969-12-31 hour 23)
    return f"make_timestamptz({ns} // 1000 - ({ns} % 1000 < 0)::BIGINT)"


def _add_export(b: _Builder, source: ExportSource) -> tuple[str, str | None]:
    """The export's view and quarantine view; returns (view, its kind: the schema's name)."""
    name, stream = sql_str(source.name), sql_str(source.stream or "")
    stored = b.paths.stored(source.parquet_root)
    files = source.parquet_files()
    b.sources.append(_Source("export", source.name, stored, files))
    # the partitions' types given: DuckDB guesses them from the directory names, and reads
    # `hour=04` as the text '04' (the whole column is text once one hour is below 10)
    reading = (
        f"read_parquet({b.glob(source.parquet_root, PARTITIONS)}, hive_partitioning = true, "
        f"hive_types = {{{PARTITION_TYPES}}}, union_by_name = true)"
    )
    columns = _columns_of(b, source, source.parquet_root, PARTITIONS, reading) if files else []
    plan = _plan_of(source, columns)
    if not files:
        typed = _typed(plan.arrow_schema) if plan is not None else {}
        typed = {**typed, **dict.fromkeys(("_segment", "_offset", "_sample"), "BIGINT")}
        reading = f"({_empty(typed | PARTITION_COLUMNS)})"
        columns = list(typed)
    kind = plan.name if plan is not None else None
    sql = f"SELECT {name} AS export, {stream} AS stream, {_time_expr(plan, columns)} AS time, *"
    docs = dict(comments.EXPORT)
    if plan is not None:
        schema_docs = _schema_docs(plan)
        for column in plan.columns:
            doc = schema_docs.get(column.name)
            docs[column.name] = comments.data_column(kind, column.name, doc)
    docs = {**{c: comments.data_column(kind, c, None) for c in columns}, **docs}
    description = comments.export_view(source.name, source.stream, stored)
    b.add(source.view, f"{sql} FROM {reading}", description, docs)
    _add_quarantine(b, source)
    if files and kind is not None and _kind_view(kind) == NIC_KIND:
        _update_rates(b, source, _time_expr(plan, columns))
    return source.view, kind


def _columns_of(
    b: _Builder, source: ExportSource, root: Path, pattern: str, reading: str
) -> list[str]:
    """The columns of the export's files; a file that is not whole Parquet is refused by
    name (`UnreadableExportFiles`), rather than with DuckDB's error of the whole glob."""
    try:
        return b.columns(f"SELECT * FROM {reading}")
    except duckdb.Error:
        damaged = unreadable_files(root, pattern)
        if damaged:
            raise UnreadableExportFiles(source.name, root, damaged) from None
        raise


def _update_rates(b: _Builder, source: ExportSource, time: str) -> None:
    """Bring the export's rates table up to date (`rates_table.py`)."""
    directory = b.paths.rates_dir / source.view
    stored = b.paths.stored(source.parquet_root)
    table = RatesTable(b.con, directory, source.parquet_root, time, stored)

    def log(line: str) -> None:
        if b.log is not None:
            b.log(f"{source.name}: {line}")

    update = table.update(log)
    b.rates.append((source, update))
    b.sources.append(_Source("rates", source.name, b.paths.stored(directory), len(update.files)))
    log(update.describe())


def _add_quarantine(b: _Builder, source: ExportSource) -> None:
    from pipeline.schemas.tables import QUARANTINE_SCHEMA

    stored = b.paths.stored(source.quarantine_root)
    files = source.quarantine_files()
    b.sources.append(_Source("quarantine", source.name, stored, files))
    files_read = b.glob(source.quarantine_root, "**/*.parquet")
    reading = f"read_parquet({files_read}, union_by_name = true)"
    if not files:
        reading = f"({_empty(_typed(QUARANTINE_SCHEMA))})"
    columns = _columns_of(b, source, source.quarantine_root, "**/*.parquet", reading)
    time = (
        "make_timestamptz(_ingest_time_ns // 1000)"
        if "_ingest_time_ns" in columns
        else "NULL::TIMESTAMPTZ"
    )
    sql = f"SELECT {sql_str(source.name)} AS export, {time} AS time, * FROM {reading}"
    b.add(
        f"{source.view}_quarantine",
        sql,
        comments.quarantine_view(source.name),
        comments.QUARANTINE,
    )


def _union(views: Iterable[str], select: str = "*") -> str:
    return " UNION ALL BY NAME ".join(f"SELECT {select} FROM {ident(v)}" for v in views)


def _add_kinds(b: _Builder, kinds: dict[str, list[str]]) -> None:
    """A view per kind (`NetworkSamples` -> `network_samples`): its exports' views, united."""
    for kind, views in kinds.items():
        name = _kind_view(kind)
        if b.taken(name):  # an export already has this name: the kind view gives way
            continue
        docs = b.views[views[0]].columns
        b.add(name, _union(views), comments.kind_view(kind, views), docs)


def _add_samples(b: _Builder, exports: dict[str, str | None]) -> None:
    parts = [
        f"SELECT export, {sql_str(kind or '')} AS kind, stream, time, date, hour, "
        f"_segment::BIGINT AS _segment, _offset::BIGINT AS _offset, "
        f"_sample::BIGINT AS _sample FROM {ident(view)}"
        for view, kind in exports.items()
    ]
    typed = dict.fromkeys(("export", "kind", "stream"), "VARCHAR")
    typed |= {"time": "TIMESTAMPTZ", **PARTITION_COLUMNS}
    typed |= dict.fromkeys(("_segment", "_offset", "_sample"), "BIGINT")
    sql = " UNION ALL ".join(parts) if parts else _empty(typed)
    b.add("samples", sql, comments.VIEWS["samples"], comments.EXPORT)


def _add_rates(b: _Builder) -> None:
    """`rates` scans the rates tables (each export's name and stream put in at the scan, so
    a renamed export keeps its table); with none, the definition over nothing gives the
    columns and their types."""
    parts = []
    for source, update in b.rates:
        files = "[" + ", ".join(b.glob(f) for f in update.files) + "]"
        name, stream = sql_str(source.name), sql_str(source.stream or "")
        parts.append(
            f"SELECT * REPLACE ({name} AS export, {stream} AS stream) FROM read_parquet({files})"
        )
    if parts:
        sql = " UNION ALL ".join(parts)
    else:
        typed = {"export": "VARCHAR", "stream": "VARCHAR", "time": "TIMESTAMPTZ", **NIC_COLUMNS}
        sql = rates_sql(f"({_empty(typed)})")
    b.add("rates", sql, comments.VIEWS["rates"], comments.RATES)


def _add_quarantine_union(b: _Builder, sources: list[ExportSource]) -> None:
    from pipeline.schemas.tables import QUARANTINE_SCHEMA

    views = [f"{s.view}_quarantine" for s in sources]
    typed = {"export": "VARCHAR", "time": "TIMESTAMPTZ", **_typed(QUARANTINE_SCHEMA)}
    sql = _union(views) if views else _empty(typed)
    b.add("quarantine", sql, comments.VIEWS["quarantine"], comments.QUARANTINE)


def _add_snapshots(b: _Builder) -> None:
    slices = b.paths.stored(b.paths.slices_snapshot)
    b.sources.append(_Source("snapshot", "slices", str(Path(slices).parent), 1))
    b.add(
        "slices",
        f"SELECT * FROM read_parquet({b.glob(b.paths.slices_snapshot)})",
        comments.VIEWS["slices"],
        comments.SLICES,
    )
    b.add(
        "lineage",
        "SELECT run_id, slice_id, stream, sensor, model, model_version, params::JSON AS params, "
        "params_hash, time, started_at, finished_at, start_time, end_time, start_cut, end_cut, "
        "input_events, input_rows, quarantined_events, output_rows, "
        "sluice_path(output_dir) AS output_dir, sluice_path(results_file) AS results_path, "
        "sluice_path(metrics_file) AS metrics_path, results_current, version "
        f"FROM read_parquet({b.glob(b.paths.lineage_snapshot)})",
        comments.VIEWS["lineage"],
        comments.LINEAGE,
    )


def _add_slice_rows(b: _Builder) -> None:
    sql = """
        WITH ranges AS (
            SELECT slice_id, stream, start_time, end_time, unnest(segments, recursive := true)
            FROM slices
        )
        SELECT r.slice_id, s.export, s.stream, s.time, s._segment, s._offset, s._sample,
               s.time BETWEEN r.start_time AND r.end_time AS in_window
        FROM ranges r JOIN samples s
          ON s.stream = r.stream AND s._segment = r.segment
         AND s._offset >= r.start_offset AND s._offset < r.end_offset
    """
    b.add("slice_rows", sql, comments.VIEWS["slice_rows"], comments.SLICE_ROWS)


def _add_replays(b: _Builder, lineage: list[dict]) -> None:
    current = [row for row in lineage if row["results_current"]]
    files = list(dict.fromkeys(row["results_file"] for row in current))
    replays = b.paths.stored(b.paths.replays_dir)
    inside = [f for f in files if f.startswith(f"{replays}/")]
    b.sources.append(_Source("replays", "replays", replays, len(inside)))
    for directory in sorted({str(Path(f).parent) for f in files if f not in inside}):
        b.sources.append(_Source("replays", "replays (--output)", directory, 1))
    identity = "l.run_id, l.slice_id, l.model, l.model_version, l.params_hash"
    if not files:
        typed = dict.fromkeys(("run_id", "slice_id", "model", "model_version"), "VARCHAR")
        sql = _empty({**typed, "params_hash": "VARCHAR", "time": "TIMESTAMPTZ"})
        b.add("replays", sql, comments.VIEWS["replays"], comments.REPLAYS)
        return
    listed = "[" + ", ".join(b.glob(b.paths.resolve(f)) for f in files) + "]"
    reading = f"read_parquet({listed}, union_by_name = true, filename = true)"
    columns = b.columns(f"SELECT * FROM {reading}")
    times = []
    if "time" in columns:  # (a result of an older Sluice may hold something else: NULL)
        times.append("TRY_CAST(r.time AS TIMESTAMPTZ)")
    if "second" in columns:
        times.append("to_timestamp(r.second)")
    time = f"coalesce({', '.join(times)})" if times else "NULL::TIMESTAMPTZ"
    excluded = ", ".join(ident(c) for c in ("filename", "time") if c in columns)
    sql = (
        f"SELECT {identity}, {time} AS time, r.* EXCLUDE ({excluded}) "
        f"FROM {reading} r JOIN lineage l ON r.filename = l.results_path AND l.results_current"
    )
    models: dict[str, list[str]] = {}
    for row in current:
        models.setdefault(row["model"], [])
    docs = {c: comments.result_column(c, sorted(models)) for c in columns}
    b.add("replays", sql, comments.VIEWS["replays"], {**docs, **comments.REPLAYS})


def _add_sources(b: _Builder, now: datetime) -> None:
    rows = ", ".join(
        f"({sql_str(s.kind)}, {sql_str(s.name)}, {sql_str(s.directory)}, {s.files})"
        for s in b.sources
    )
    stamp = f"TIMESTAMPTZ {sql_str(now.isoformat())}"
    sql = (
        "SELECT kind, name, directory, sluice_path(directory) AS location, files, "
        f"{stamp} AS time FROM (VALUES {rows}) t(kind, name, directory, files)"
    )
    b.add("sources", sql, comments.VIEWS["sources"], comments.SOURCES)


def _path_macros(home: Path, temporary: bool = False) -> list[str]:
    """`sluice_path(p)`: a stored path (`AnalyticsPaths.stored`) as the file it names, under
    `getvariable('sluice_home')`, else the home of the refresh; `sluice_glob(p)`: a stored
    pattern (`AnalyticsPaths.pattern`) as the glob a view reads, the home's own `[`, `*`, `?`
    escaped like the rest of the path (`glob_escaped`), so that a home named `data[1]` or
    `a*b` reads itself and nothing else. A home given with a trailing slash is the same home."""
    create = "CREATE OR REPLACE TEMP MACRO" if temporary else "CREATE OR REPLACE MACRO"
    home_now = f"rtrim(coalesce(getvariable('sluice_home'), {sql_str(home.absolute())}), '/')"
    escaped = f"regexp_replace({home_now}, '([\\[*?])', '[\\1]', 'g')"
    return [
        f"{create} sluice_path(p) AS CASE WHEN starts_with(p, '/') THEN p "
        f"ELSE {home_now} || '/' || p END",
        f"{create} sluice_glob(p) AS CASE WHEN starts_with(p, '/') THEN p "
        f"ELSE {escaped} || '/' || p END",
    ]


def _open_for_writing(database: Path) -> duckdb.DuckDBPyConnection:
    if not database.exists():
        _create(database)
    try:
        return duckdb.connect(str(database))
    except duckdb.IOException as exc:
        msg = f"cannot open {database}"
        raise AnalyticsError(msg, _unopened(exc)) from None


def _unopened(exc: duckdb.IOException) -> str:
    """Why DuckDB did not open the database, and what to do about it."""
    found = str(exc).splitlines()[0]
    if "lock" in found:
        return f"{found} (another process is using it: close it and retry)"
    if "not a valid DuckDB database" in found or "Could not read enough bytes" in found:
        return (
            f"{found}: the file is damaged or no DuckDB database. It holds nothing a refresh"
            " does not rebuild (views over the exports): move it away and refresh again"
        )
    return found


def _create(database: Path) -> None:
    """A new, empty database, put in place whole or not at all (a file DuckDB began and
    never finished, its process killed or the disk full, is one no later refresh could
    open), and never over one that another refresh has just created."""
    database.parent.mkdir(parents=True, exist_ok=True)
    staging = durable.staging_name(database)
    try:
        duckdb.connect(str(staging)).close()
        durable.fsync_path(staging)
        with contextlib.suppress(FileExistsError):
            os.link(staging, database)
        durable.fsync_dir(database.parent)
    finally:
        staging.unlink(missing_ok=True)


def _build(b: _Builder, exports: list[ExportSource], lineage: list[dict]) -> None:
    kinds: dict[str, list[str]] = {}
    made: dict[str, str | None] = {}
    for source in exports:
        view, kind = _add_export(b, source)
        made[view] = kind
        if kind is not None:
            kinds.setdefault(kind, []).append(view)
    _add_kinds(b, kinds)
    _add_samples(b, made)
    _add_rates(b)
    _add_quarantine_union(b, exports)
    _add_snapshots(b)
    _add_slice_rows(b)
    _add_replays(b, lineage)
    _add_sources(b, datetime.now(tz=UTC))


def refresh(
    paths: AnalyticsPaths,
    exports: list[ExportSource],
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """Snapshot the lineage (and, if there is none yet, an empty slices snapshot), bring the
    rates table of every NIC export up to date, then (re)create every view, and drop views of
    exports no longer known; return the view names. `log` gets a line per rates table.

    The views are first made as temporary views, which checks every one of them; the file's
    views are then replaced in one transaction, so a failed refresh leaves them as they were
    (rates files they read are removed only after that transaction). A database path DuckDB
    cannot write is refused before anything is written (`check_database`)."""
    check_database(paths.database)
    try:
        if not paths.slices_snapshot.exists():
            snapshot_slices(paths, [])
        lineage = snapshot_lineage(paths)
        con = _open_for_writing(paths.database)
    except OSError as exc:  # a read-only or full disk, a regular file where a folder goes
        msg = f"cannot write {exc.filename or paths.database}"
        in_the_way = exc.errno in (errno.EEXIST, errno.ENOTDIR)
        reason = "a regular file is where a directory should be" if in_the_way else exc.strerror
        raise AnalyticsError(msg, reason or str(exc)) from None
    try:
        con.execute(f"SET VARIABLE sluice_home = {sql_str(paths.home.absolute())}")
        for macro in _path_macros(paths.home, temporary=True):
            con.execute(macro)
        builder = _Builder(paths, con, log=log)
        _build(builder, exports, lineage)
        _commit(con, paths, builder.views)
        tables = {update.directory for _, update in builder.rates}
        sweep([p for _, update in builder.rates for p in update.obsolete])
        sweep(stale_tables(paths.rates_dir, tables))
        return list(builder.views)
    except duckdb.Error as exc:
        msg = f"cannot build the views of {paths.database}"
        raise AnalyticsError(msg, str(exc).splitlines()[0]) from None
    finally:
        con.close()


def _commit(con: duckdb.DuckDBPyConnection, paths: AnalyticsPaths, views: dict) -> None:
    stale = con.execute(
        "SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary "
        "AND database_name = current_database()"
    ).fetchall()
    con.execute("BEGIN")
    for (name,) in stale:
        if name not in views:
            con.execute(f"DROP VIEW {ident(name)}")
    for macro in _path_macros(paths.home):
        con.execute(macro)
    con.execute(f"CREATE OR REPLACE MACRO sluice_catalog_version() AS {CATALOG_VERSION}")
    for name, view in views.items():
        con.execute(f"DROP VIEW IF EXISTS temp.{ident(name)}")
        con.execute(f"CREATE OR REPLACE VIEW main.{ident(name)} AS {view.sql}")
        con.execute(f"COMMENT ON VIEW main.{ident(name)} IS {sql_str(view.comment)}")
        for column, doc in view.columns.items():
            target = f"main.{ident(name)}.{ident(column)}"
            con.execute(f"COMMENT ON COLUMN {target} IS {sql_str(doc or column)}")
    con.execute("COMMIT")


def view_rows(paths: AnalyticsPaths, views: Iterable[str]) -> dict[str, Any]:
    """Row counts of `views` (through the read-only sandbox)."""
    from pipeline.analytics.sandbox import open_database

    with open_database(paths) as con:
        return {v: con.execute(f"SELECT count(*) FROM {ident(v)}").fetchone()[0] for v in views}
