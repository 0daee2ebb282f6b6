"""The settings: `sluice.toml` validated once into typed objects (stores, streams, exports,
models, checks).

The configuration file is read where it is asked for (never at import) and checked with
msgspec against the frozen structs below: a misspelt key, a wrong type or a reference to an
undefined store, model or schema is one `SettingsError` that names the key to fix (a stream's
key by the stream's name). Paths are relative to the home directory (`$SLUICE_HOME`, default
`./.sluice`); `SLUICE_*` environment variables override (`load_settings`): an unknown one, or
a value that does not fit, is an `EnvironmentVariableError` naming the variable
(`check_environment`). `[spark]` and `[collectors]` are validated by their own parts and kept
here as raw tables, so that the file is checked as a whole. `store_uri` turns what a user
gives for a store (`--store cloud`, a name here, or a URI) into a URI, in one place."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from pipeline.config import (
    VARIABLES,
    EnvironmentVariableError,
    StoreUriError,
    checked_store_uri,
    config_path,
    default_store_uri,
    is_store_uri,
    load_config,
    same_store,
    sluice_home,
    unknown_variables,
)
from pipeline.errors import SluiceError
from pipeline.streams import InvalidName, parse_stream

_FAMILY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: The schemas `pipeline.schemas` bundles. This layer sits beneath `pipeline.schemas`, so it
#: looks at the files rather than importing the module (tests/test_settings.py checks that
#: both see the same names).
BUNDLED_SCHEMAS_DIR = Path(__file__).with_name("schemas") / "avsc"


class SettingsError(SluiceError, ValueError):
    """`sluice.toml` (or a `SLUICE_*` variable) holds something Sluice cannot use."""

    def __init__(self, where: str, problem: str) -> None:
        self.where, self.problem = where, problem
        msg = f"{where}: {problem} (fix it and retry; every key is described in docs/reference.md)"
        super().__init__(msg)


class UnknownStore(SluiceError, ValueError):
    """A store named (on the command line, or by a variable) that sluice.toml does not have."""

    def __init__(self, where: str, name: str, known: list[str], source: str) -> None:
        self.where, self.name = where, name
        msg = (
            f"{where} {name!r} is neither a store URI (embedded:<dir>, pravega://host:9090) nor "
            f"the name of a store of [stores.*] in {source} (known: {', '.join(known)})"
        )
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
    mirror: MirrorTable  # where the stream is mirrored: [streams.NAME.mirror], its stream at least
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


#: Tables of named entries, checked entry by entry so that an error names the entry.
_NAMED_TABLES: dict[str, type[_Table]] = {
    "stores": StoreTable,
    "streams": StreamTable,
    "models": ModelTable,
}


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
    check_environment(env)
    document = load_config(path)  # a path given (or SLUICE_CONFIG) must exist; ./sluice.toml not
    path = path or config_path()
    where = str(path)
    document, origins = _apply_env(document, env)
    for table, kind in _NAMED_TABLES.items():
        entries = document.get(table, {})
        if not isinstance(entries, dict):
            raise SettingsError(where, f"[{table}] must hold one table per name ([{table}.NAME])")
        for name, entry in entries.items():
            try:
                msgspec.convert(entry, kind, strict=False)
            except msgspec.ValidationError as exc:
                raise SettingsError(where, _toml_path(str(exc), f"{table}.{name}")) from None
    try:
        table = msgspec.convert(document, SluiceToml, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(where, _toml_path(str(exc), "")) from None
    home = (home or sluice_home()).absolute()
    return _resolve(table, document, home, path if path.exists() else None, origins)


def check_environment(environ: Mapping[str, str]) -> None:
    """Refuse `SLUICE_*` variables Sluice does not read (a typo would silently not apply),
    and store URIs that are not store URIs, naming the variable."""
    tables = {f"SLUICE_{t.upper()}_": kind for t, kind in _OVERRIDABLE_TABLES.items()}
    readable = set(VARIABLES) - set(tables) | set(_table_variables())
    for name in sorted(environ):
        prefix = next((p for p in tables if name.startswith(p)), None)
        if prefix is not None and name not in _table_variables():
            keys = ", ".join(_table_variables(prefix))
            hint = f"check its spelling: the keys of this table are {keys}"
        elif prefix is None and name in unknown_variables({name: ""}):
            close = difflib.get_close_matches(name, sorted(readable), n=1, cutoff=0.85)
            hint = f"did you mean {close[0]}?" if close else "check its spelling"
            hint += " (every variable Sluice reads: pipeline/config.py)"
        else:
            continue
        raise EnvironmentVariableError(name, "is not a variable Sluice reads", hint)
    for variable in sorted(environ):
        if variable == "SLUICE_STORE" or variable.startswith("SLUICE_STORE_"):
            if environ[variable]:
                checked_store_uri(environ[variable], variable)


def _table_variables(prefix: str = "SLUICE_") -> list[str]:
    """`SLUICE_<TABLE>_<KEY>` of every key of the overridable tables (starting with `prefix`)."""
    names = [
        f"SLUICE_{table.upper()}_{f.name.upper()}"
        for table, kind in _OVERRIDABLE_TABLES.items()
        for f in msgspec.structs.fields(kind)
    ]
    return [n for n in names if n.startswith(prefix)]


def store_uri(
    text: str | None, where: str = "--store", settings: SluiceSettings | None = None
) -> str:
    """The URI of the store a user names (`where` says how: `--store`): None is the default
    store; a store URI is taken as it is (a relative embedded directory is under the home,
    as in sluice.toml); any other text is the name of a store of sluice.toml (`cloud`)."""
    if text is None:
        return default_store_uri()
    text = text.strip()
    if is_store_uri(text):
        return checked_store_uri(text, where, settings.home if settings else None)
    if ":" in text:
        raise StoreUriError(where, text)
    settings = settings or load_settings()
    if text in settings.stores:
        return settings.stores[text]
    source = str(settings.source or "sluice.toml")
    raise UnknownStore(where, text, sorted(settings.stores), source)


def _toml_path(problem: str, prefix: str) -> str:
    """msgspec says `$.mirror.store` of an entry; say `streams.<name>.mirror.store`. A missing
    key (`Object missing required field `mirror``) is said as the key that is required."""
    missing = re.fullmatch(r"Object missing required field `(\w+)`(?: - at `\$\.?(.*)`)?", problem)
    if missing:
        key = ".".join(part for part in (prefix, missing[2], missing[1]) if part)
        return f"`{key}` is required and missing"
    if not prefix:
        return problem.replace("`$.", "`").replace("[...]", ".<name>").replace("`$`", "the file")
    if " - at `$" not in problem:
        return f"{problem} - at `{prefix}`"
    return problem.replace("`$.", f"`{prefix}.").replace("`$`", f"`{prefix}`")


def _apply_env(document: dict, env: Mapping[str, str]) -> tuple[dict, dict[str, str]]:
    """The document with `SLUICE_<TABLE>_<KEY>` and `SLUICE_STORE_<NAME>` applied, each value
    checked against its key's type; and which keys came from which variable."""
    document = {k: dict(v) if isinstance(v, dict) else v for k, v in document.items()}
    origins: dict[str, str] = {}
    for table, kind in _OVERRIDABLE_TABLES.items():
        for field in msgspec.structs.fields(kind):
            variable = f"SLUICE_{table.upper()}_{field.name.upper()}"
            value = env.get(variable)
            if value is None:
                continue
            try:
                converted = msgspec.convert(_env_value(value, field.type), field.type, strict=False)
            except msgspec.ValidationError as exc:
                problem = f"{value!r} does not fit [{table}] {field.name} ({exc})"
                raise EnvironmentVariableError(variable, problem, "fix or unset it") from None
            document.setdefault(table, {})[field.name] = converted
            origins[f"{table}.{field.name}"] = variable
    stores = {name: dict(t) for name, t in document.get("stores", {}).items()}
    for key, value in env.items():
        if key.startswith("SLUICE_STORE_") and value:
            name = key.removeprefix("SLUICE_STORE_").lower()
            stores[name] = {"uri": value}
            origins[f"stores.{name}"] = key
    if stores:
        document["stores"] = stores
    return document, origins


def _env_value(value: str, kind: Any) -> Any:
    """An environment text in the shape msgspec expects (lists are comma-separated)."""
    if getattr(kind, "__origin__", None) is tuple:
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _resolve(
    table: SluiceToml, raw: dict, home: Path, source: Path | None, origins: dict[str, str]
) -> SluiceSettings:
    where = str(source or "sluice.toml")
    stores = {
        name: _store_uri(name, t, home, origins.get(f"stores.{name}", where))
        for name, t in table.stores.items()
    }
    stores.setdefault("edge", default_store_uri())
    for name, model in table.models.items():
        if ":" not in model.function:
            problem = f"models.{name}.function = {model.function!r} is not `module:function`"
            raise SettingsError(where, problem)
    bad_formats = sorted(set(table.exports.formats) - {"parquet", "csv"})
    if bad_formats:
        problem = f"exports.formats names {', '.join(bad_formats)}: use parquet and/or csv"
        raise SettingsError(origins.get("exports.formats", where), problem)
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
    _check_mirrors(families, where)
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


def _check_mirrors(families: tuple[StreamFamily, ...], where: str) -> None:
    """Refuse a family mirrored into its own stream (each batch would copy the copies of the
    one before) and two families mirrored into one stream (each one's exports, slices and
    replays would read the other's events as its own)."""
    for i, family in enumerate(families):
        target = (family.mirror_store_uri, family.mirror_stream)
        if family.mirror_stream == family.stream and same_store(family.store_uri, target[0]):
            problem = (
                f"streams.{family.name}.mirror.stream = {family.mirror_stream!r} in the same store "
                "is the stream itself: a stream cannot be mirrored into itself"
            )
            raise SettingsError(where, problem)
        for other in families[i + 1 :]:
            if other.mirror_stream == target[1] and same_store(other.mirror_store_uri, target[0]):
                problem = (
                    f"streams.{family.name} and streams.{other.name} are both mirrored into "
                    f"{target[1]!r} of one store: each family's exports and replays would read "
                    "the other's events too; give each its own mirror.stream"
                )
                raise SettingsError(where, problem)


def _under(home: Path, path: str) -> Path:
    return (home / Path(path).expanduser()).absolute()


def _store_uri(name: str, table: StoreTable, home: Path, where: str) -> str:
    if table.uri and table.embedded:
        raise SettingsError(where, f"stores.{name} sets both uri and embedded: keep one")
    if name == "edge":  # the default store: one rule, pipeline.config.default_store_uri
        return default_store_uri()
    if table.uri:
        try:
            return checked_store_uri(table.uri, f"stores.{name}.uri", home)
        except StoreUriError as exc:
            raise SettingsError(where, str(exc)) from None
    if table.embedded:
        return f"embedded:{_under(home, table.embedded)}"
    return default_store_uri()


def _check_schema(family: str, schema: str, where: str) -> None:
    """A bundled schema's name, or an `.avsc` file (as `pipeline.schemas.schema_path` finds)."""
    if (BUNDLED_SCHEMAS_DIR / f"{schema}.avsc").is_file():
        return
    if schema.endswith(".avsc") and Path(schema).expanduser().is_file():
        return
    bundled = ", ".join(sorted(p.stem for p in BUNDLED_SCHEMAS_DIR.glob("*.avsc")))
    problem = (
        f"streams.{family}.schema = {schema!r} is neither a bundled schema ({bundled}) nor an "
        ".avsc file that exists"
    )
    raise SettingsError(where, problem)


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
    _check_schema(name, t.schema, where)
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
