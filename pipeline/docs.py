"""The generated parts of the guides in `docs/`: the reference (`sluice.toml`, every `SLUICE_*`
variable, the collector's settings, the command line) and the analysts' list of views and
columns.

Everything here is read from the code and the database as they are now, so a guide cannot
drift from the product: the typed settings (`pipeline/settings.py`'s structs, the keys that
`collectors/settings.py` and each driver read, `pipeline/config.py`'s `VARIABLES`), the
argparse parser (`pipeline.cli.build_parser`), and a DuckDB database built by a real refresh
in a scratch home (the views' and columns' `COMMENT`s). `tests/docs/test_generated.py` fails
when a committed file differs from what this module makes; regenerate with

    PYTHONPATH=. .venv/bin/python -m pipeline.docs

Descriptions come from the code first (a field's trailing comment in `pipeline/settings.py`),
then from `_DESCRIPTIONS` below, then from the comments of the commented configuration files
(`sluice.toml`, `collectors/collector.example.toml`: they describe their example values, so a
key whose comment is no general meaning is described here); a new setting appears at once,
with "—" until it is described.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import os
import re
import socket
import sys
import tempfile
import tokenize
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference.md"
ANALYSTS = DOCS / "analysts.md"
REGENERATE = "PYTHONPATH=. .venv/bin/python -m pipeline.docs"
BEGIN_VIEWS = "<!-- generated: views (python -m pipeline.docs) -->"
END_VIEWS = "<!-- end of generated views -->"
_HOME = "/SLUICE_HOME"  # the scratch home's name while generating; shown as $SLUICE_HOME
_WIDTH = "100"  # argparse wraps help to $COLUMNS

#: Type and default of collector keys the loader only reads when they are present.
_OPTIONAL_KEYS: dict[str, tuple[str, str]] = {
    "collector.metrics_port": ("integer", "unset"),
    "collector.metrics_address": ("text", '"127.0.0.1"'),
}

#: Descriptions of keys that neither the code nor the commented files describe.
_DESCRIPTIONS: dict[str, str] = {
    "stores.NAME.uri": "the store's URI: embedded:<dir>, pravega://host:9090, pravegas://…",
    "stores.NAME.embedded": "an embedded store in this directory (relative to $SLUICE_HOME)",
    "streams.NAME.store": "the store the stream is in (a name of [stores.*])",
    "streams.NAME.stream": "SCOPE/STREAM: the stream the family's collectors write",
    "streams.NAME.schema": "a bundled Avro schema's name, or an .avsc file",
    "streams.NAME.segments": "segments of the stream when Sluice creates it",
    "streams.NAME.models": "names of [models.*] replayed over every slice of the stream",
    "streams.NAME.sensor_columns": "the columns that name one sensor in the exports (the asset "
    "checks' duplicates and gaps are per sensor); sluice.toml's network: RemoteAddr, Interface",
    "streams.NAME.mirror.store": "the store of the mirror: a name of [stores.*], declared"
    " there (the default, cloud, too)",
    "streams.NAME.mirror.stream": "SCOPE/STREAM of the mirror",
    "streams.NAME.mirror.routing_key": "one routing key for every mirrored event (one per site)",
    "streams.NAME.bookmark.sensor_by": "what names a sensor: routing_key, or columns (A,B)",
    "streams.NAME.bookmark.below": "conditions FIELD=VALUE: a sample's value below VALUE",
    "streams.NAME.bookmark.above": "conditions FIELD=VALUE: a sample's value above VALUE",
    "streams.NAME.bookmark.burst_mbps": "a condition: a NIC's rx or tx rate since its previous "
    "sample above this many Mbit/s",
    "streams.NAME.bookmark.predicate": "module:function conditions over a pandas DataFrame",
    "streams.NAME.bookmark.slices_stream": "the stream (in the mirror's store) the slices go to",
    "exports.dir": "the directory of the exports, <dir>/<family>/ (relative to $SLUICE_HOME)",
    "exports.formats": "parquet and/or csv",
    "models.NAME.function": "the model: a Python callable module:function",
    "models.NAME.params": "keyword arguments of the model (part of its replays' identity)",
    "checks.quarantine_rate_max": "blocking check: the highest share of refused events",
    "checks.mirror_lag_max_bytes": "warning check: the mirror's lag behind the edge tail",
    "dagster.timezone": "the timezone of the replay schedule",
    "analytics.database": "the DuckDB file of the views (relative to $SLUICE_HOME)",
    "spark.master": "the Spark master: local[*], spark://host:7077, k8s://…, yarn "
    "(SLUICE_SPARK_MASTER)",
    "spark.app_name": "the Spark application's name",
    "spark.driver_host": "the address the driver binds to and advertises "
    "(SLUICE_SPARK_DRIVER_HOST); a cluster's workers must reach it",
    "spark.log_level": "Spark's log level (SLUICE_SPARK_LOG_LEVEL)",
    "spark.ui": "start the Spark UI (SLUICE_SPARK_UI)",
    "spark.remote": "auto (attach to `sluice spark start`'s server when one runs, else a local "
    "Spark), local, or an sc:// URL (SLUICE_SPARK_REMOTE)",
    "spark.class_archive": "map the archive of Spark's classes, built in the background under "
    "~/.cache/sluice/spark-classes when missing, so local JVMs start sooner "
    "(SLUICE_SPARK_CLASS_ARCHIVE; default true)",
    "spark.server_max_daemons": "a job attaching to `sluice spark start`'s server restarts it "
    "first when it holds more Python worker daemons than this (Spark never stops them: about "
    "10 per catch-up run, 1 GB with their workers) and no client is attached "
    "(SLUICE_SPARK_SERVER_MAX_DAEMONS; default 40)",
    "spark.conf": 'any Spark configuration: [spark.conf] "spark.executor.memory" = "2g"',
    "collectors": "the demo's collector instances ([collectors.NAME], as a collector.toml's)",
    "collector.store": "the default store of every instance",
    "collector.state_dir": "where the buffers are (default $SLUICE_HOME/collector)",
    "collector.metrics_port": "serve Prometheus metrics on this TCP port (1-65535), the numbers "
    "of `sluice collect status`; unset: no endpoint",
    "collector.metrics_address": "the IP address the metrics endpoint binds (127.0.0.1 unless "
    "set; another address only with metrics_port)",
    "instance.driver": "nic, accelerometer, files (csv, parquet), mqtt, generator, or the "
    "Pravega Sensor Collector class it replaces",
    "instance.stream": "SCOPE/STREAM the instance writes (or `scope` + `stream`)",
    "instance.store": "the store URI (PRAVEGA_CONTROLLER_URI); default: [collector] store",
    "instance.routing_key": "the events' routing key and the samples' RemoteAddr",
    "instance.samples_per_event": "samples per event (SAMPLES_PER_EVENT)",
    "instance.buffer_file": "the instance's SQLite buffer (PERSISTENT_QUEUE_FILE, DATABASE_FILE)",
    "instance.when_full": "a full buffer blocks the driver, or sheds new samples (counted)",
    "instance.txn_protocol": "flush, commit, or auto (flush where the store can flush a "
    "transaction); both exactly-once, in order: see collectors/collector.example.toml",
    "instance.scope": "the scope, when `stream` is given without one",
    "instance.transaction_timeout_minutes": "the Pravega Sensor Collector's name for the "
    "transaction lease (minutes)",
    "instance.exactly_once": "Pravega Sensor Collector setting: accepted; always exactly-once",
    "instance.create_scope": "Pravega Sensor Collector setting: accepted; scopes are created",
    "instance.memory_queue_capacity_elements": "Pravega Sensor Collector setting: accepted, "
    "without effect (samples go to the SQLite buffer)",
    "instance.enable_large_event": "Pravega Sensor Collector setting: accepted; events over "
    "8 MiB are split",
    "files.format": "the files' format: csv or parquet",
    "files.directories": "the directories files are dropped into (FILE_SPEC, comma-separated "
    "there)",
    "files.settle_ms": "a file is read once unchanged this long "
    "(MIN_TIME_IN_MILLIS_TO_UPDATE_FILE)",
    "files.scan_interval_ms": "how often the directories are scanned for new files (INTERVAL_MS)",
    "files.time_column": "the column holding each row's time (default: the time of reading)",
    "files.time_unit": "the unit of time_column",
    "files.delimiter": "the CSV delimiter",
    "files.extension": "files with this extension are read (default: the format's)",
    "files.completed_dir": "move completed files here instead of keeping or deleting them",
    "files.failed_dir": "files that could not be read go here, with <name>.reason.txt",
    "generator.samples_per_sec": "samples a second",
    "generator.max_samples": "stop (and drain) after this many samples",
    "generator.sensor": "the sensor's name (default: the instance's)",
    "mqtt.topics": "the topics to subscribe to (MQTT wildcards allowed)",
    "mqtt.host": "the broker's host",
    "mqtt.port": "the broker's port",
    "mqtt.client_id": "a stable client id: the broker keeps the session across restarts",
    "mqtt.username": "the broker user",
    "mqtt.password": "the broker password (never shown in errors or logs)",
    "mqtt.tls": "connect with TLS",
    "mqtt.ca_file": "the CA certificate for TLS (default: the system's)",
    "mqtt.keepalive": "seconds between MQTT keep-alive pings",
    "mqtt.payload_format": "how a message's payload is stored: text (UTF-8), json (parsed), "
    "or base64 (any bytes)",
    "mqtt.max_delay_ms": "the longest a received message waits before it is buffered",
    "nic.interface": "the network interface to sample, e.g. eth0 (NETWORK_INTERFACE)",
    "nic.sysfs_root": "where the interfaces' statistics are read",
}


# --- sluice.toml ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """One key: where it is, its type, its default (None: required) and what it means."""

    key: str
    kind: str
    default: str | None
    description: str


def _type_name(kind: Any) -> str:
    origin = typing.get_origin(kind)
    args = typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args if a is not type(None)) + " (optional)"
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return "table"
    return {str: "text", int: "integer", float: "number", bool: "true/false"}.get(
        kind, getattr(kind, "__name__", str(kind))
    )


def _default_text(field: msgspec.structs.FieldInfo) -> str | None:
    if field.required:
        return None
    value = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
    if isinstance(value, msgspec.Struct):
        text = "(table)"
    elif isinstance(value, dict | tuple) and not value:
        text = "empty" if isinstance(value, dict) else "[]"
    elif isinstance(value, tuple):
        text = "[" + ", ".join(f'"{v}"' for v in value) + "]"
    elif isinstance(value, str):
        text = f'"{value}"'
    elif value is None:
        text = "unset"
    else:
        text = str(value).lower() if isinstance(value, bool) else str(value)
    return text


def _field_comments(cls: type) -> dict[str, str]:
    """A struct field's trailing comment in its class's source (`key: int = 1  # …`)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = lines[token.start[0] - 1]
        found = re.match(r"\s*(\w+)\s*:", line)
        text = token.string.lstrip("#").strip()
        if found and not text.startswith(("type:", "noqa")):
            comments[found.group(1)] = text
    return comments


def _toml_comments(path: Path) -> dict[str, str]:
    """`table.key` → the comment after `key = value` in a commented TOML file (its continuation
    lines, a comment alone at the same column, joined); table names as `stores.NAME`. In a
    collector's `[instances.NAME]`, a key after `driver = "x"` is also `x.key`."""
    comments: dict[str, str] = {}
    table, driver, last, column = "", "", None, -1
    for line in path.read_text().splitlines():
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            table, driver, last = _generic_table(header.group(1)), "", None
            continue
        if found := re.match(r'driver\s*=\s*"(\w+)"', line):
            driver = found.group(1)
        assignment = re.match(r"#?\s*(\w+)\s*=\s*[^#]*?\s(#\s*(.*))$", line)
        if assignment and not line.startswith("# "):
            key = f"{table}.{assignment.group(1)}" if table else assignment.group(1)
            comments.setdefault(key, assignment.group(3).strip())
            if driver:
                comments.setdefault(f"{driver}.{assignment.group(1)}", comments[key])
            last, column = key, line.index(assignment.group(2))
            continue
        more = re.match(r"(\s*)#\s*(.*)$", line)
        if last and more and line.index("#") == column and more.group(2):
            comments[last] += " " + more.group(2).strip()
            continue
        last = None
    return comments


def _generic_table(name: str) -> str:
    """`streams.network.mirror` → `streams.NAME.mirror`; `instances.net1` → `instances.NAME`."""
    parts = name.strip().split(".")
    if parts[0] in ("stores", "streams", "models", "collectors", "instances") and len(parts) > 1:
        parts[1] = "NAME"
    return ".".join(parts)


def toml_settings() -> list[Setting]:
    """Every key of `sluice.toml`, walked from `pipeline.settings.SluiceToml`."""
    from pipeline.settings import SluiceToml

    described = _toml_comments(ROOT / "sluice.toml")
    settings: list[Setting] = []

    def walk(cls: type, prefix: str) -> None:
        comments = _field_comments(cls)
        for field in msgspec.structs.fields(cls):
            key = f"{prefix}{field.name}"
            kind, args = field.type, typing.get_args(field.type)
            inner = next((a for a in args if isinstance(a, type)), None)
            if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
                if field.required:  # a table that must be there ([streams.NAME.mirror])
                    text = comments.get(field.name) or "—"
                    settings.append(Setting(key, "table", None, text))
                walk(kind, f"{key}.")
            elif typing.get_origin(kind) is dict and issubclass(args[1], msgspec.Struct):
                walk(args[1], f"{key}.NAME.")
            elif inner is not None and issubclass(inner, msgspec.Struct):
                walk(inner, f"{key}.")  # an optional table ([streams.NAME.bookmark])
            else:
                text = (
                    comments.get(field.name) or _DESCRIPTIONS.get(key) or described.get(key) or "—"
                )
                settings.append(Setting(key, _type_name(kind), _default_text(field), text))

    walk(SluiceToml, "")
    return [row for s in settings for row in (_spark_settings() if s.key == "spark" else [s])]


def _spark_settings() -> list[Setting]:
    """`[spark]` is kept raw by `pipeline/settings.py` and read by `SparkSettings`."""
    import dataclasses

    from pipeline.spark.session import SparkSettings

    rows = []
    for field in dataclasses.fields(SparkSettings):
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.name == "conf":
            kind, text = "table", "empty"
        else:
            kind = _type_name(type(default))
            text = json.dumps(default)  # as TOML writes it: true, 40, "local[*]"
        key = f"spark.{field.name}"
        rows.append(Setting(key, kind, text, _DESCRIPTIONS.get(key, "—")))
    return rows


def variables() -> list[tuple[str, str]]:
    """Every `SLUICE_*` variable: `pipeline.config.VARIABLES`, with the variables of each
    overridable table (`SLUICE_CHECKS_<KEY>`) spelled out from the typed settings."""
    from pipeline.config import VARIABLES
    from pipeline.settings import SluiceToml

    tables = {f.name: f.type for f in msgspec.structs.fields(SluiceToml)}
    rows: list[tuple[str, str]] = []
    for name, meaning in VARIABLES.items():
        rows.append((name + ("<…>" if name.endswith("_") else ""), meaning))
        table = name.removeprefix("SLUICE_").rstrip("_").lower()
        kind = tables.get(table)
        if name.endswith("_") and isinstance(kind, type) and issubclass(kind, msgspec.Struct):
            rows.extend(
                (f"{name}{f.name.upper()}", f"[{table}] {f.name}")
                for f in msgspec.structs.fields(kind)
            )
    return rows


# --- the collector's settings --------------------------------------------------------------


@dataclass
class _Read:
    table: str  # `collector`, `instance`, or a driver's name
    key: str
    kind: str
    default: Any
    choices: tuple[str, ...] = ()


_READERS = ("text", "secret", "character", "integer", "number", "flag", "choice", "texts", "path")


@contextlib.contextmanager
def _recording(reads: dict[tuple[str, str], _Read]) -> Iterator[None]:
    """Record every key an `OptionsReader` is asked for while loading collector settings:
    which table (the [collector] table, the keys every instance has, or a driver's own), the
    kind of value, its default. Keys a driver only looks at when present (`has`) count too."""
    from collectors import options

    originals = {name: getattr(options.OptionsReader, name) for name in (*_READERS, "has")}
    depth = [0]

    def table_of(reader: options.OptionsReader) -> str:
        caller = sys._getframe(2).f_globals.get("__name__", "")
        if caller.startswith("collectors.drivers."):
            return caller.rsplit(".", 1)[1]
        return "collector" if reader.where.endswith("[collector]") else "instance"

    def wrap(name: str):
        original = originals[name]

        def reader(self, key, *args, **kwargs):
            if depth[0] == 0:
                table = table_of(self)
                if name == "has":
                    reads.setdefault((table, key), _Read(table, key, "", None))
                else:
                    choices = args[0] if name == "choice" else ()
                    rest = args[1:] if name == "choice" else args
                    default = kwargs.get("default", rest[0] if rest else options._MISSING)
                    reads[table, key] = _Read(table, key, name, default, tuple(choices))
            depth[0] += 1
            try:
                return original(self, key, *args, **kwargs)
            finally:
                depth[0] -= 1

        return reader

    try:
        for name in originals:
            setattr(options.OptionsReader, name, wrap(name))
        yield
    finally:
        for name, original in originals.items():
            setattr(options.OptionsReader, name, original)


_PLACEHOLDERS = {
    "text": "x",
    "secret": "x",
    "character": ",",
    "integer": 1,
    "number": 1.0,
    "flag": False,
    "texts": ["x"],
    "path": "/nonexistent",
}


def collector_settings() -> list[Setting]:
    """Every key `collectors.settings.load_settings` and each driver's `parse_options` read,
    found by loading a configuration of each driver (required keys get a placeholder)."""
    from collectors import options
    from collectors.drivers.registry import SPECS
    from collectors.errors import ConfigError
    from collectors.settings import load_settings

    reads: dict[tuple[str, str], _Read] = {}
    with _recording(reads), tempfile.TemporaryDirectory() as scratch:
        for spec in SPECS:
            table: dict[str, Any] = {"driver": spec.name, "stream": "docs/x"}
            for _ in range(20):
                path = Path(scratch) / "collector.toml"
                path.write_text(_toml_document(table))
                try:
                    load_settings(path, {}, f"embedded:{_HOME}/streams", Path(_HOME))
                    break
                except ConfigError:
                    missing = [
                        r
                        for r in reads.values()
                        if r.default is options._MISSING and r.key not in table and r.kind
                    ]
                    if not missing:
                        raise
                    read = missing[-1]
                    table[read.key] = read.choices[0] if read.choices else _PLACEHOLDERS[read.kind]
    described = _toml_comments(ROOT / "collectors" / "collector.example.toml")
    common = _common_comments()
    instance_keys = {r.key for r in reads.values() if r.table == "instance"}
    rows: list[Setting] = []
    for read in reads.values():
        if read.table not in ("collector", "instance") and read.key in instance_keys:
            continue  # a driver asking about a key every instance has (`when_full`)
        if read.table == "collector":
            keys = [f"collector.{read.key}"]
        elif read.table == "instance":
            keys = [f"instance.{read.key}", f"instances.NAME.{read.key}", f"common.{read.key}"]
        else:
            keys = [f"{read.table}.{read.key}"]
        found = {**described, **{f"common.{k}": v for k, v in common.items()}}
        text = next((_DESCRIPTIONS.get(k) for k in keys if k in _DESCRIPTIONS), None)
        text = text or next((found[k] for k in keys if k in found), "—")
        kind = {"": "—", "texts": "list of text"}.get(read.kind, read.kind)
        if read.choices:
            kind = " | ".join(read.choices)
        default = _collector_default(read, options._MISSING)
        kind, default = _OPTIONAL_KEYS.get(f"{read.table}.{read.key}", (kind, default))
        rows.append(Setting(f"{read.table}.{read.key}", kind, default, text))
    order = {"collector": 0, "instance": 1}
    return sorted(rows, key=lambda s: (order.get(s.key.split(".")[0], 2), s.key.split(".")[0]))


def _setting_rows(settings: list[Setting]) -> list[str]:
    """The reference's table rows of `settings`: key, type, default (or `required`), meaning."""
    rows = []
    for s in settings:
        default = "required" if s.default is None else f"`{s.default}`"
        rows.append(f"| `{s.key}` | {_cell(s.kind)} | {_cell(default)} | {_cell(s.description)} |")
    return rows


def _collector_default(read: _Read, missing: object) -> str | None:
    if read.default is missing:
        return None
    if not read.kind or read.default is None:
        return "unset"
    if read.default == socket.gethostname():
        return '"<host name>"'
    text = str(read.default)
    if isinstance(read.default, tuple | list):
        text = "[" + ", ".join(f'"{v}"' for v in read.default) + "]"
    elif isinstance(read.default, bool):
        text = text.lower()
    elif isinstance(read.default, str):
        text = f'"{text}"'
    return text.replace(_HOME, "$SLUICE_HOME")


def _common_comments() -> dict[str, str]:
    """The `# key   default   description` table of collector.example.toml."""
    comments: dict[str, str] = {}
    text = (ROOT / "collectors" / "collector.example.toml").read_text()
    for found in re.finditer(r"^# (\w+)\s{2,}(.+)$", text, re.MULTILINE):
        rest = re.sub(r"^\S+\s{2,}", "", found.group(2).strip())  # the default column
        comments.setdefault(found.group(1), re.sub(r"\s{2,}", " ", rest))
    return comments


def _toml_document(table: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, bool):
            return str(v).lower()
        return f'"{v}"' if isinstance(v, str) else str(v)

    return "[instances.NAME]\n" + "".join(f"{k} = {value(v)}\n" for k, v in table.items())


def psc_variables() -> list[tuple[str, str]]:
    """`PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_<KEY>` keys and the setting each one sets."""
    from collectors.drivers.registry import SPECS
    from collectors.psc_env import COMMON_KEYS

    rows = [(key, setting) for key, setting in COMMON_KEYS.items()]
    rows += [(key, f"{setting} ({s.name})") for s in SPECS for key, setting in s.env_keys.items()]
    return rows


# --- the command line ----------------------------------------------------------------------


def commands() -> list[tuple[str, str]]:
    """`sluice …` and each subcommand's `--help`, from `pipeline.cli.build_parser`."""
    from pipeline.cli import build_parser

    found: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        found.append((name, parser.format_help()))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    walk(child, f"{name} {sub}")

    with _environment(COLUMNS=_WIDTH, SLUICE_HOME=_HOME):
        walk(build_parser(), "sluice")
    return found


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- the analytics views -------------------------------------------------------------------


def views() -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(view, comment, [(column, type, comment)]) of the database a refresh builds from this
    checkout's `sluice.toml` in a scratch home (no data: each view has its declared columns)."""
    import duckdb

    from pipeline.analytics.catalog import refresh
    from pipeline.analytics.snapshots import snapshot_slices
    from pipeline.analytics.sources import AnalyticsPaths, discover_exports
    from pipeline.settings import load_settings

    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(ROOT / "sluice.toml", environ={}, home=Path(home))
        paths = AnalyticsPaths.from_settings(settings)
        with _environment(SLUICE_HOME=home):
            exports = discover_exports(settings, [])
            snapshot_slices(paths, [])
            refresh(paths, exports)
        con = duckdb.connect(str(paths.database), read_only=True)
        try:
            listed = con.execute(
                "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal "
                "AND NOT temporary ORDER BY view_name"
            ).fetchall()
            found = []
            for name, comment in listed:
                columns = con.execute(
                    "SELECT column_name, data_type, comment FROM duckdb_columns() "
                    "WHERE table_name = ? ORDER BY column_index",
                    [name],
                ).fetchall()
                found.append((name, comment or "", columns))
        finally:
            con.close()
    return found


# --- rendering -----------------------------------------------------------------------------


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def render_reference() -> str:
    out = [
        "# Reference",
        "",
        "<!-- Generated by `python -m pipeline.docs` from the typed settings and the parser;",
        f"     do not edit: regenerate with `{REGENERATE}`. -->",
        "",
        "Generated from the code: the typed settings of `pipeline/settings.py`, the keys that",
        "`collectors/settings.py` and each driver read, `pipeline/config.py`'s variables, and",
        "the `sluice` command's parser. The guides: [README](README.md).",
        "",
        "- [`sluice.toml`](#sluicetoml)",
        "- [`SLUICE_*` environment variables](#sluice_-environment-variables)",
        "- [The collector's `collector.toml`](#the-collectors-collectortoml)",
        "- [The command line](#the-command-line)",
        "",
        "## `sluice.toml`",
        "",
        "In the working directory, or `$SLUICE_CONFIG`. `NAME` is a name you choose",
        "(`[stores.cloud]`, `[streams.network]`). Relative paths are under `$SLUICE_HOME`.",
        "A key that is not listed here is refused, naming the key.",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    out += _setting_rows(toml_settings())
    out += [
        "",
        "## `SLUICE_*` environment variables",
        "",
        "Each overrides `sluice.toml`; an unknown `SLUICE_*` variable is refused as a likely",
        "typo, naming the closest known one. Lists are comma-separated.",
        "",
        "| variable | meaning |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {_cell(meaning)} |" for name, meaning in variables()]
    out += [
        "",
        "## The collector's `collector.toml`",
        "",
        "`sluice collect --config collector.toml`: a `[collector]` table and one",
        "`[instances.NAME]` table per driver instance. An instance has the `instance` keys and",
        "its driver's own; `collectors/collector.example.toml` shows them in use.",
        "",
        "| table.key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    out += _setting_rows(collector_settings())
    out += [
        "",
        "Instances may also come from the Pravega Sensor Collector's variables:",
        "`PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_CLASS` names the driver (its name or the Java",
        "class it replaces) and `PRAVEGA_SENSOR_COLLECTOR_<INSTANCE>_<KEY>` sets a key (any",
        "key above, upper-case, or these names); without `<INSTANCE>_` a key applies to every",
        "instance.",
        "",
        "| `<KEY>` | sets |",
        "|---|---|",
    ]
    out += [f"| `{key}` | `{setting}` |" for key, setting in psc_variables()]
    out += ["", "## The command line", ""]
    for name, text in commands():
        out += [f"### `{name}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(out).rstrip() + "\n"


def render_views() -> str:
    out = [BEGIN_VIEWS, ""]
    listed = views()
    out += [f"- [`{name}`](#{name}): {_cell(c)}" for name, c, _ in listed]
    for name, comment, columns in listed:
        out += [
            "",
            f"### `{name}`",
            "",
            comment,
            "",
            "| column | type | meaning |",
            "|---|---|---|",
        ]
        out += [f"| `{c}` | `{t}` | {_cell(doc)} |" for c, t, doc in columns]
    out += ["", END_VIEWS]
    return "\n".join(out)


def render_analysts(current: str) -> str:
    """`current` (docs/analysts.md) with its generated region replaced."""
    start, end = current.find(BEGIN_VIEWS), current.find(END_VIEWS)
    if start < 0 or end < start:
        msg = f"{ANALYSTS} has no region between {BEGIN_VIEWS!r} and {END_VIEWS!r}"
        raise ValueError(msg)
    return current[:start] + render_views() + current[end + len(END_VIEWS) :]


def generated() -> dict[Path, str]:
    """Each generated file and the text it should hold now."""
    return {
        REFERENCE: render_reference(),
        ANALYSTS: render_analysts(ANALYSTS.read_text()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="regenerate the generated parts of docs/")
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in generated().items():
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    for path in stale:
        verb = "stale" if args.check else "regenerated"
        print(f"{verb}: {path.relative_to(ROOT)}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
