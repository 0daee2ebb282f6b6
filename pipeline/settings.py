"""The settings: `sluice.toml` validated once into typed objects (stores, streams, exports,
models, checks).

The configuration file is read where it is asked for (never at import) and checked with
msgspec against the frozen structs below: a misspelt key, a wrong type or a reference to an
undefined store or model is one `SettingsError` that names the key to fix. Paths are relative
to the home directory (`$SLUICE_HOME`, default `./.sluice`); `SLUICE_*` environment variables
override (`load_settings`). `[spark]` and `[collectors]` are validated by their own parts and
kept here as raw tables, so that the file is checked as a whole."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import config_path, default_store_uri, load_config, sluice_home
from pipeline.errors import SluiceError
from pipeline.streams import InvalidName, parse_stream

_FAMILY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")


class SettingsError(SluiceError, ValueError):
    """`sluice.toml` (or a `SLUICE_*` variable) holds something Sluice cannot use."""

    def __init__(self, where: str, problem: str) -> None:
        self.where, self.problem = where, problem
        msg = f"{where}: {problem} (fix it and retry; every key is described in sluice.toml)"
        super().__init__(msg)


class _Table(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class StoreTable(_Table, kw_only=True):
    uri: str | None = None
    embedded: str | None = None  # a directory, relative to the home


class MirrorTable(_Table, kw_only=True):
    store: str = "cloud"
    stream: str
    routing_key: str | None = None


class BookmarkTable(_Table, kw_only=True):
    """Where the bookmark job records slices (`pipeline/jobs/bookmark.py`); any condition."""

    sensor_by: str = "routing_key"
    below: tuple[str, ...] = ()
    above: tuple[str, ...] = ()
    burst_mbps: float | None = None
    predicate: tuple[str, ...] = ()
    min_samples: int = 1  # a run becomes a slice when this many samples meet a condition
    slices_stream: str = "sluice/slices"


class StreamTable(_Table, kw_only=True):
    store: str = "edge"
    stream: str
    schema: str
    segments: int = 1
    models: tuple[str, ...] = ()
    max_sample_gap_seconds: float = 5.0
    sensor_columns: tuple[str, ...] = ("RemoteAddr",)
    mirror: MirrorTable
    bookmark: BookmarkTable | None = None


class ExportsTable(_Table, kw_only=True):
    dir: str = "exports"
    formats: tuple[str, ...] = ("parquet", "csv")


class ModelTable(_Table, kw_only=True):
    function: str
    params: dict[str, Any] = {}


class ChecksTable(_Table, kw_only=True):
    quarantine_rate_max: float = 0.01
    mirror_lag_max_bytes: int = 64 * 1024 * 1024


class DagsterTable(_Table, kw_only=True):
    tail_sensor_interval_seconds: int = 30
    replay_schedule: str = "0 3 * * *"
    timezone: str = "UTC"


class AnalyticsTable(_Table, kw_only=True):
    database: str = "analytics/sluice.duckdb"


_OVERRIDABLE_TABLES = {"checks": ChecksTable, "dagster": DagsterTable, "exports": ExportsTable}


class SluiceToml(_Table, kw_only=True):
    stores: dict[str, StoreTable] = {}
    streams: dict[str, StreamTable] = {}
    exports: ExportsTable = ExportsTable()
    models: dict[str, ModelTable] = {}
    checks: ChecksTable = ChecksTable()
    dagster: DagsterTable = DagsterTable()
    analytics: AnalyticsTable = AnalyticsTable()
    spark: dict[str, Any] = {}
    collectors: dict[str, Any] = {}


class StreamFamily(msgspec.Struct, frozen=True, kw_only=True):
    """One configured stream and everything derived from it: its mirror, exports, replays.

    `name` is the family's name in sluice.toml (`[streams.NAME]`); it names the Dagster
    assets, the output directories and the checkpoints of the family.
    """

    name: str
    store: str
    store_uri: str
    stream: str
    schema: str
    segments: int
    models: tuple[str, ...]
    max_sample_gap_seconds: float
    mirror_store: str
    mirror_store_uri: str
    mirror_stream: str
    mirror_routing_key: str | None
    sensor_columns: tuple[str, ...]
    bookmark: BookmarkTable | None
    export_dir: Path


class SluiceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The settings of the whole configuration file, with paths resolved against `home`."""

    home: Path
    source: Path | None
    stores: dict[str, str]
    streams: tuple[StreamFamily, ...]
    export_formats: tuple[str, ...]
    exports_dir: Path
    models: dict[str, ModelTable]
    checks: ChecksTable
    dagster: DagsterTable
    analytics_database: Path
    spark: dict[str, Any]
    collectors: dict[str, Any]
    raw: dict[str, Any]

    def family(self, name: str) -> StreamFamily:
        for family in self.streams:
            if family.name == name:
                return family
        known = ", ".join(f.name for f in self.streams) or "none"
        where = str(self.source or "sluice.toml")
        raise SettingsError(where, f"no [streams.{name}] (known: {known})")

    @property
    def dagster_home(self) -> Path:
        return self.home / "dagster"


def load_settings(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> SluiceSettings:
    """Read `sluice.toml` (`path`, else `$SLUICE_CONFIG`, else ./sluice.toml) and check it.

    `SLUICE_*` environment variables override it: `SLUICE_STORE_<NAME>` the URI of store NAME
    (`SLUICE_STORE_CLOUD=pravega://host:9090`; a store without `uri` or `embedded` is the
    default store, `$SLUICE_STORE`, else `embedded:$SLUICE_HOME/streams`, where `sluice
    collect` writes); `SLUICE_CHECKS_<KEY>`, `SLUICE_DAGSTER_<KEY>`, `SLUICE_EXPORTS_<KEY>` a
    scalar of those tables (`SLUICE_CHECKS_QUARANTINE_RATE_MAX=0.05`)."""
    env = os.environ if environ is None else environ
    path = path or config_path()
    document = load_config(path)
    where = str(path)
    document = _apply_env(document, env)
    try:
        table = msgspec.convert(document, SluiceToml, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(where, _toml_path(str(exc))) from None
    home = (home or sluice_home()).absolute()
    return _resolve(table, document, home, path if path.exists() else None)


def _toml_path(problem: str) -> str:
    """msgspec says `$.streams[...].segments`; say `streams.<name>.segments` instead."""
    return problem.replace("`$.", "`").replace("[...]", ".<name>").replace("`$`", "the file")


def _apply_env(document: dict, env: Mapping[str, str]) -> dict:
    """The document with `SLUICE_<TABLE>_<KEY>` and `SLUICE_STORE_<NAME>` applied."""
    document = {k: dict(v) if isinstance(v, dict) else v for k, v in document.items()}
    for table, kind in _OVERRIDABLE_TABLES.items():
        for field in msgspec.structs.fields(kind):
            value = env.get(f"SLUICE_{table.upper()}_{field.name.upper()}")
            if value is not None:
                document.setdefault(table, {})[field.name] = _env_value(value, field.type)
    stores = {name: dict(t) for name, t in document.get("stores", {}).items()}
    for key, value in env.items():
        if key.startswith("SLUICE_STORE_") and value:
            stores[key.removeprefix("SLUICE_STORE_").lower()] = {"uri": value}
    if stores:
        document["stores"] = stores
    return document


def _env_value(value: str, kind: Any) -> Any:
    """An environment text in the shape msgspec expects (lists are comma-separated)."""
    if getattr(kind, "__origin__", None) is tuple:
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _resolve(table: SluiceToml, raw: dict, home: Path, source: Path | None) -> SluiceSettings:
    where = str(source or "sluice.toml")
    stores = {name: _store_uri(name, t, home, where) for name, t in table.stores.items()}
    stores.setdefault("edge", default_store_uri())
    for name, model in table.models.items():
        if ":" not in model.function:
            problem = f"models.{name}.function = {model.function!r} is not `module:function`"
            raise SettingsError(where, problem)
    bad_formats = sorted(set(table.exports.formats) - {"parquet", "csv"})
    if bad_formats:
        problem = f"exports.formats names {', '.join(bad_formats)}: use parquet and/or csv"
        raise SettingsError(where, problem)
    exports_dir = _under(home, table.exports.dir)
    families = tuple(
        _family(
            name,
            t=t,
            stores=stores,
            models=table.models,
            exports_dir=exports_dir,
            where=where,
        )
        for name, t in sorted(table.streams.items())
    )
    return SluiceSettings(
        home=home,
        source=source,
        stores=stores,
        streams=families,
        export_formats=table.exports.formats,
        exports_dir=exports_dir,
        models=dict(table.models),
        checks=table.checks,
        dagster=table.dagster,
        analytics_database=_under(home, table.analytics.database),
        spark=dict(table.spark),
        collectors=dict(table.collectors),
        raw=raw,
    )


def _under(home: Path, path: str) -> Path:
    return (home / Path(path).expanduser()).absolute()


def _store_uri(name: str, table: StoreTable, home: Path, where: str) -> str:
    if table.uri and table.embedded:
        raise SettingsError(where, f"stores.{name} sets both uri and embedded: keep one")
    if name == "edge":  # the default store: one rule, pipeline.config.default_store_uri
        return default_store_uri()
    if table.uri:
        return table.uri
    if table.embedded:
        return f"embedded:{_under(home, table.embedded)}"
    return default_store_uri()


def _family(
    name: str,
    *,
    t: StreamTable,
    stores: dict[str, str],
    models: dict[str, ModelTable],
    exports_dir: Path,
    where: str,
) -> StreamFamily:
    for key, store in (("store", t.store), ("mirror.store", t.mirror.store)):
        if store not in stores:
            known = ", ".join(sorted(stores))
            problem = f"streams.{name}.{key} = {store!r} is not one of [stores.*] ({known})"
            raise SettingsError(where, problem)
    unknown = [m for m in t.models if m not in models]
    if unknown:
        problem = f"streams.{name}.models names {', '.join(unknown)}, not defined in [models.*]"
        raise SettingsError(where, problem)
    if not _FAMILY_NAME.fullmatch(name):
        problem = f"[streams.{name}]: a stream family name is letters, digits and '_'"
        raise SettingsError(where, problem)
    for key, stream in (("stream", t.stream), ("mirror.stream", t.mirror.stream)):
        try:
            parse_stream(stream)
        except InvalidName as exc:
            raise SettingsError(where, f"streams.{name}.{key} = {stream!r}: {exc}") from None
    if t.models and t.bookmark is None:
        problem = f"streams.{name}.models are replayed over slices: add [streams.{name}.bookmark]"
        raise SettingsError(where, problem)
    if t.segments < 1:
        raise SettingsError(where, f"streams.{name}.segments must be at least 1")
    return StreamFamily(
        name=name,
        store=t.store,
        store_uri=stores[t.store],
        stream=t.stream,
        schema=t.schema,
        segments=t.segments,
        models=t.models,
        max_sample_gap_seconds=t.max_sample_gap_seconds,
        mirror_store=t.mirror.store,
        mirror_store_uri=stores[t.mirror.store],
        mirror_stream=t.mirror.stream,
        mirror_routing_key=t.mirror.routing_key,
        sensor_columns=t.sensor_columns,
        bookmark=t.bookmark,
        export_dir=exports_dir / name,
    )
