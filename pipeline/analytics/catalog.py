"""The analysts' DuckDB database: views over every file Sluice writes, by absolute path.

    duckdb.connect("/home/me/.sluice/analytics/sluice.duckdb").sql("SELECT * FROM rates LIMIT 5")

The file holds views only (no copied data), so it stays small and current and opens in plain
`duckdb` with no Sluice import. Views: `samples` and one per export, `rates`, `quarantine`,
`slices`, `lineage`, `replays`; `refresh` (run by `sluice sql` and `sluice plot`) rebuilds
them, a source without files yet as an empty view. Each view: `DESIGN.md`, "Views"."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from pipeline import durable
from pipeline.analytics.rates import NIC_COLUMNS, rates_sql
from pipeline.errors import SluiceError
from pipeline.jobs.replay import LineageRecord
from pipeline.jobs.slices import SliceRecord

if TYPE_CHECKING:
    from pipeline.settings import SluiceSettings

_SQL_TYPES = {int: "BIGINT", "int": "BIGINT", str: "VARCHAR", "str": "VARCHAR"}
QUARANTINE_COLUMNS = {
    "_segment": "BIGINT",
    "_offset": "BIGINT",
    "reason": "VARCHAR",
    "payload": "BLOB",
}


class AnalyticsError(SluiceError):
    """The analytics database cannot be built or queried as asked."""

    def __init__(self, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        msg = f"{what}: {reason}"
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class AnalyticsPaths:
    """Where analytics reads and writes: the database file (sluice.toml `[analytics]
    database`, default `$SLUICE_HOME/analytics/sluice.duckdb`) and files under the home."""

    home: Path
    database: Path

    @classmethod
    def from_settings(cls, settings: SluiceSettings) -> AnalyticsPaths:
        return cls(settings.home, settings.analytics_database)

    @property
    def slices_snapshot(self) -> Path:
        return self.home / "analytics" / "slices.parquet"

    @property
    def lineage_dir(self) -> Path:
        return self.home / "lineage"

    @property
    def plots_dir(self) -> Path:
        return self.home / "plots"


@dataclass(frozen=True, slots=True)
class ExportSource:
    """One export job's output directory, its name and the streams it exports."""

    name: str
    root: Path
    streams: tuple[str, ...] = ()

    @property
    def view(self) -> str:
        return re.sub(r"[^A-Za-z0-9_]", "_", self.name.replace("/", "_"))

    def matches(self, text: str) -> bool:
        """True for the export's name or one of its streams."""
        return text in (self.name, *self.streams)

    @property
    def parquet_root(self) -> Path:
        """The directory holding the `date=`/`hour=` partitions (the root or its parquet/)."""
        for candidate in (self.root / "parquet", self.root):
            if any(candidate.glob("date=*")):
                return candidate
        return self.root

    @property
    def quarantine_root(self) -> Path:
        for candidate in (self.root / "_quarantine", self.parquet_root / "_quarantine"):
            if candidate.exists():
                return candidate
        return self.root / "_quarantine"

    def parquet_glob(self) -> str | None:
        pattern = "date=*/hour=*/*.parquet"
        return _glob_if_any(self.parquet_root, pattern)

    def quarantine_glob(self) -> str | None:
        return _glob_if_any(self.quarantine_root, "**/*.parquet")


def _glob_if_any(root: Path, pattern: str) -> str | None:
    if any(root.glob(pattern)):
        return str(root.absolute() / pattern)
    return None


def _sql_str(value: str | Path) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# --- finding the sources --------------------------------------------------------------------


def discover_exports(
    settings: SluiceSettings, extra: Iterable[ExportSource] = ()
) -> list[ExportSource]:
    """Exports named on the command line, then each `[streams.NAME]` family of sluice.toml
    (its export directory, `exports/NAME` under the home). A name given twice keeps the first."""
    found: dict[str, ExportSource] = {}
    families = (
        ExportSource(f.name, f.export_dir, (f.stream, f.mirror_stream)) for f in settings.streams
    )
    for source in (*extra, *families):
        found.setdefault(source.name, source)
    return list(found.values())


def parse_export_option(text: str) -> ExportSource:
    """`SCOPE/STREAM=DIR` from the command line."""
    stream, eq, root = text.partition("=")
    if not eq or stream.count("/") != 1 or not root:
        reason = "expected SCOPE/STREAM=DIR, e.g. examples/network=/data/network-export"
        msg = f"--export {text!r}"
        raise AnalyticsError(msg, reason)
    return ExportSource(stream, Path(root).absolute(), (stream,))


# --- the views ------------------------------------------------------------------------------


def _empty_view(columns: dict[str, str]) -> str:
    cols = ", ".join(f"NULL::{sql_type} AS {_ident(name)}" for name, sql_type in columns.items())
    return f"SELECT {cols} WHERE false"


def _record_columns(record_type: type) -> dict[str, str]:
    columns = {}
    for f in fields(record_type):
        base = str(f.type).split("|")[0].strip()
        columns[f.name] = _SQL_TYPES.get(base, "VARCHAR")
    return columns


def _export_views(source: ExportSource, con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """SQL of the per-export views; a NIC export also gets its rates view."""
    views: dict[str, str] = {}
    glob = source.parquet_glob()
    name = _sql_str(source.name)
    if glob is None:
        views[source.view] = f"SELECT {name} AS export, * FROM ({_empty_view(NIC_COLUMNS)})"
    else:
        views[source.view] = (
            f"SELECT {name} AS export, * FROM read_parquet({_sql_str(glob)}, "
            "hive_partitioning = true, union_by_name = true)"
        )
    columns = {row[0] for row in con.execute(f"DESCRIBE {views[source.view]}").fetchall()}
    if {"RemoteAddr", "Interface", "TimestampNanos", "RxBytes", "TxBytes"} <= columns:
        views[f"{source.view}_rates"] = rates_sql(f"({views[source.view]})")
    qglob = source.quarantine_glob()
    views[f"{source.view}_quarantine"] = (
        f"SELECT {name} AS export, * FROM read_parquet({_sql_str(qglob)}, union_by_name = true)"
        if qglob
        else f"SELECT {name} AS export, * FROM ({_empty_view(QUARANTINE_COLUMNS)})"
    )
    return views


def _union(view_names: list[str], empty: str) -> str:
    if not view_names:
        return empty
    return " UNION ALL BY NAME ".join(f"SELECT * FROM {_ident(v)}" for v in view_names)


def _lineage_view(paths: AnalyticsPaths) -> str:
    columns = _record_columns(LineageRecord)
    glob = _glob_if_any(paths.lineage_dir, "*.json")
    if glob is None:
        return _empty_view(columns)
    spec = ", ".join(f"{_sql_str(k)}: {_sql_str(v)}" for k, v in columns.items())
    return f"SELECT * FROM read_json({_sql_str(glob)}, columns = {{{spec}}})"


def _replays_view(paths: AnalyticsPaths) -> str:
    """Results of every replay its lineage names, joined to the run that made them."""
    results = []
    for record_path in sorted(paths.lineage_dir.glob("*.json")):
        record = json.loads(record_path.read_text())
        if Path(record.get("results_path", "")).exists():
            results.append(record["results_path"])
    if not results:
        return _empty_view({"slice_id": "VARCHAR", "model": "VARCHAR", "model_version": "VARCHAR"})
    files = "[" + ", ".join(_sql_str(p) for p in results) + "]"
    return (
        "SELECT l.slice_id, l.model, l.model_version, r.* EXCLUDE (filename) "
        f"FROM read_parquet({files}, union_by_name = true, filename = true) r "
        "JOIN lineage l ON r.filename = l.results_path"
    )


def _slices_view(paths: AnalyticsPaths) -> str:
    if paths.slices_snapshot.exists():
        return f"SELECT * FROM read_parquet({_sql_str(paths.slices_snapshot.absolute())})"
    times = {"start_time": "TIMESTAMPTZ", "end_time": "TIMESTAMPTZ"}
    return _empty_view({**_record_columns(SliceRecord), **times})


def snapshot_slices(paths: AnalyticsPaths, records: list[SliceRecord]) -> None:
    """Write the slices as the Parquet file the `slices` view reads (atomic replace), with
    `start_time`/`end_time` as timestamps next to the nanosecond fields."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrow_types = {"BIGINT": pa.int64(), "VARCHAR": pa.string()}
    fields_ = [(name, arrow_types[t]) for name, t in _record_columns(SliceRecord).items()]
    table = pa.Table.from_pylist([asdict(r) for r in records], schema=pa.schema(fields_))
    for name in ("start_time", "end_time"):
        stamps = table[f"{name}_ns"].cast(pa.timestamp("ns", tz="UTC"))
        table = table.append_column(name, stamps)
    with durable.atomic_path(paths.slices_snapshot) as staging:
        pq.write_table(table, staging)


def refresh(paths: AnalyticsPaths, exports: list[ExportSource]) -> list[str]:
    """(Re)create every view in the database file; return the view names."""
    paths.database.parent.mkdir(parents=True, exist_ok=True)
    try:
        con = duckdb.connect(str(paths.database))
    except duckdb.IOException as exc:
        reason = f"{exc} (is another process writing to it? close it and retry)"
        msg = f"cannot open {paths.database}"
        raise AnalyticsError(msg, reason) from None
    try:
        views: dict[str, str] = {}
        for source in exports:
            views.update(_export_views(source, con))
        sample_views = [s.view for s in exports]
        views["samples"] = _union(sample_views, _empty_view({"export": "VARCHAR", **NIC_COLUMNS}))
        rate_views = [f"{s.view}_rates" for s in exports if f"{s.view}_rates" in views]
        empty_samples = _empty_view({"export": "VARCHAR", **NIC_COLUMNS})
        views["rates"] = _union(rate_views, rates_sql(f"({empty_samples})"))
        views["quarantine"] = _union(
            [f"{s.view}_quarantine" for s in exports],
            _empty_view({"export": "VARCHAR", **QUARANTINE_COLUMNS}),
        )
        views["slices"] = _slices_view(paths)
        views["lineage"] = _lineage_view(paths)
        views["replays"] = _replays_view(paths)
        con.execute("BEGIN")
        for name, sql in views.items():
            con.execute(f"CREATE OR REPLACE VIEW {_ident(name)} AS {sql}")
        con.execute("COMMIT")
        return list(views)
    finally:
        con.close()


def query(paths: AnalyticsPaths, sql: str) -> tuple[list[str], list[tuple]]:
    """Run one SQL statement on the database; column names and rows."""
    con = duckdb.connect(str(paths.database), read_only=True)
    try:
        cursor = con.execute(sql)
        columns = [d[0] for d in cursor.description or ()]
        return columns, cursor.fetchall() if columns else []
    except duckdb.Error as exc:
        msg = "query failed"
        raise AnalyticsError(msg, str(exc).splitlines()[0]) from None
    finally:
        con.close()
