"""The collector's settings: `collector.toml` and the Pravega Sensor Collector's environment
variables, validated once at start-up into frozen, typed objects (`CollectorSettings`, and one
`InstanceSettings` per instance).

Instances from the environment (`psc_env.py`) join those of the file; an instance named in
both takes the environment's values over the file's. Each driver reads its own keys with its
`parse_options` (found through `drivers/registry.py`). Every problem is one `ConfigError` line
that names the key (or variable) to fix; `collector.example.toml` lists every setting.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from collectors.buffer import WhenFull
from collectors.drivers.registry import find_spec, known_names
from collectors.errors import ConfigError
from collectors.options import Option, OptionsReader, from_toml
from collectors.psc_env import PREFIX, instances_from_env, variable_names
from pipeline.config import FileModes, StoreUriError, checked_store_uri
from pipeline.streams import (
    DEFAULT_TXN_LEASE_SECONDS,
    InvalidName,
    InvalidRoutingKey,
    parse_stream,
)
from pipeline.streams.names import check_routing_key
from pipeline.streams.values import MAX_SEGMENTS, MAX_TXN_LEASE_SECONDS

_INSTANCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")
_COLLECTOR_KEYS = (
    "store",
    "state_dir",
    "drain_timeout_seconds",
    "unhealthy_after_seconds",
    "metrics_port",
    "metrics_address",
)
#: Where the metrics endpoint listens unless `metrics_address` says otherwise: this box only.
DEFAULT_METRICS_ADDRESS = "127.0.0.1"

#: Upper limits of the instance settings, with why (said when a value is refused). The
#: drivers hold an event's samples in memory until it is full, the generator builds one
#: commit's events at once, and the sender holds a whole transaction's events.
MAX_SAMPLES_PER_EVENT = 100_000
MAX_CAPACITY_EVENTS = 100_000_000
MAX_EVENTS_PER_TXN = 100_000
MAX_TXN_BYTES = 1024**3
MAX_LINGER_MS = 3_600_000
#: Ten years: a lease is kept in nanoseconds as a signed 64-bit number (292 years at most).
LIMITS = {
    "samples_per_event": (
        "a driver holds an event's samples in memory until it is full, and an event is "
        "at most 8 MiB (larger ones are split): use fewer"
    ),
    "capacity_events": "a buffer of more events than that needs more disk than an edge box has",
    "max_events_per_txn": "use fewer (max_txn_bytes bounds a transaction's size)",
    "max_txn_bytes": "the sender holds a transaction's events in memory: use 64 MiB or less",
    "linger_ms": "waiting more than an hour for a fuller transaction is never useful",
    "segments": "a stream has at most that many segments",
}

#: How the sender commits a batch (see `coordinator.py`): `flush` needs a store whose
#: transactions can be flushed, `commit` works with any store, `auto` picks by the store.
TxnProtocol = Literal["auto", "flush", "commit"]
TXN_PROTOCOLS: tuple[TxnProtocol, ...] = ("auto", "flush", "commit")


@dataclass(frozen=True, slots=True)
class InstanceSettings:
    """One driver instance: what it samples, where it buffers, which stream it feeds."""

    name: str
    driver: str
    stream: str
    store: str
    routing_key: str | None
    samples_per_event: int
    buffer_file: Path
    capacity_events: int
    when_full: WhenFull
    max_events_per_txn: int
    max_txn_bytes: int
    linger_ms: int
    txn_lease_seconds: float
    txn_protocol: TxnProtocol
    segments: int
    options: Any  # the driver module's own frozen `Options`


@dataclass(frozen=True, slots=True)
class CollectorSettings:
    instances: tuple[InstanceSettings, ...]
    state_dir: Path
    drain_timeout_seconds: float
    notes: tuple[str, ...]  # settings accepted but without effect here: logged at start-up
    #: An instance whose driver cannot reach its source, or whose sender cannot reach the
    #: store, for longer than this fails `sluice collect status --check`.
    unhealthy_after_seconds: float = 60.0
    file_modes: FileModes = field(default_factory=FileModes)
    #: Serve Prometheus metrics (`collectors/metrics.py`) on this TCP port; None: no endpoint.
    metrics_port: int | None = None
    #: The address the metrics endpoint binds: loopback unless another is set explicitly.
    metrics_address: str = DEFAULT_METRICS_ADDRESS


def load_settings(
    path: Path | None,
    environ: Mapping[str, str],
    default_store: str,
    home: Path,
    store_override: str | None = None,
) -> CollectorSettings:
    """Read `path` (if given) and `environ`, check everything, return the settings."""
    document = _read_toml(path) if path is not None else {}
    where = str(path) if path is not None else "no config file, no environment"
    unknown = sorted(set(document) - {"collector", "instances"})
    if unknown:
        raise ConfigError(
            where, f"unknown table {', '.join(unknown)}", "use [collector] and [instances.NAME]"
        )
    top = OptionsReader(
        f"{where} [collector]", from_toml(document.get("collector", {}), "collector")
    )
    store = store_override or _store(top, "store", default_store, home)
    state_dir = top.path("state_dir", home / "collector").absolute()
    drain = top.number("drain_timeout_seconds", 30.0)
    unhealthy_after = top.number("unhealthy_after_seconds", 60.0, positive=True)
    metrics_port, metrics_address = _metrics_endpoint(top)
    top.finish(f"known: {', '.join(_COLLECTOR_KEYS)}")

    tables = {
        name: from_toml(t, f"instances.{name}") for name, t in _toml_instances(document, where)
    }
    for name, table in instances_from_env(environ).items():
        match = next((n for n in tables if n.lower() == name.lower()), name)
        tables[match] = {**tables.get(match, {}), **table}
    if not tables:
        raise ConfigError(
            where,
            "no collector instances are configured",
            "pass `sluice collect --config FILE` (collectors/collector.quickstart.toml runs "
            "anywhere), add [instances.NAME] with a driver to it, or set "
            "PRAVEGA_SENSOR_COLLECTOR_<NAME>_CLASS",
        )
    notes: list[str] = []
    instances = tuple(
        _instance(name, table, store=store, state_dir=state_dir, home=home, notes=notes)
        for name, table in sorted(tables.items())
    )
    _check_distinct_buffers(instances)
    return CollectorSettings(
        instances,
        state_dir,
        drain,
        tuple(notes),
        unhealthy_after,
        FileModes.from_environment(environ),
        metrics_port,
        metrics_address,
    )


def _store(r: OptionsReader, key: str, default: str, home: Path) -> str:
    """A store URI, checked now (an unknown scheme would otherwise be retried for ever)."""
    uri = r.text(key, default)
    try:
        return checked_store_uri(uri, r.origin(key), home)
    except StoreUriError:
        r.fail(key, "is not a store URI", "use embedded:<dir> or pravega://host:9090")


def _metrics_endpoint(r: OptionsReader) -> tuple[int | None, str]:
    """`metrics_port` (none: no endpoint) and `metrics_address` (an IP address, default
    loopback; another one only when set, and only with a port to serve on)."""
    port = None
    if r.has("metrics_port"):
        port = r.integer("metrics_port")
        if not 1 <= port <= 65535:
            hint = "use a fixed port from 1 to 65535 that your scraper is told, e.g. 9464"
            r.fail("metrics_port", "is not a TCP port", hint)
    if not r.has("metrics_address"):
        return port, DEFAULT_METRICS_ADDRESS
    address = r.text("metrics_address")
    try:
        address = str(ipaddress.ip_address(address))
    except ValueError:
        r.fail(
            "metrics_address",
            "is not an IP address",
            "use 127.0.0.1 (the default: this box only), ::1, or an address of this box's "
            "interfaces (0.0.0.0: every interface)",
        )
    if port is None:
        r.fail("metrics_address", "is set but metrics_port is not", "set metrics_port too")
    return port, address


def _read_toml(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(
            str(path), "file not found", "pass --config with an existing file"
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            str(path), "is a directory, not a configuration file", "pass --config FILE.toml"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None


def _toml_instances(document: dict, where: str) -> list[tuple[str, dict]]:
    instances = document.get("instances", {})
    if not isinstance(instances, dict) or not all(isinstance(v, dict) for v in instances.values()):
        raise ConfigError(where, "[instances] must hold one table per instance", "[instances.NAME]")
    return list(instances.items())


def _instance(
    name: str,
    table: dict[str, Option],
    *,
    store: str,
    state_dir: Path,
    home: Path,
    notes: list[str],
) -> InstanceSettings:
    if not _INSTANCE_NAME.fullmatch(name):
        msg = f"instance {name!r}"
        raise ConfigError(msg, "invalid name", "use letters, digits, '_', '-', '.'")
    r = OptionsReader(f"instance {name}", table)
    driver_name = r.text("driver")
    found = find_spec(driver_name)
    if found is None:
        r.fail(
            "driver",
            "is not a known driver class",
            f"use one of {known_names()} (or a Pravega Sensor Collector class name they replace)",
        )
    spec, implied = found
    for key, value in implied.items():
        table.setdefault(key, Option(value, f"{r.origin('driver')} (implied)"))
    from_env = r.origin("driver").startswith(PREFIX)
    names = variable_names(name, spec.env_keys) if from_env else {}
    r = OptionsReader(f"instance {name} ({spec.name})", table, names)
    r.text("driver")
    _legacy_settings(r, notes)
    stream = _stream(r)
    lease = _lease_seconds(r)
    settings = InstanceSettings(
        name=name,
        driver=spec.name,
        stream=stream,
        store=_store(r, "store", store, home),
        routing_key=_routing_key(r),
        samples_per_event=_bounded(r, "samples_per_event", 1000, MAX_SAMPLES_PER_EVENT),
        buffer_file=r.path("buffer_file", state_dir / f"{name}.db").absolute(),
        capacity_events=_bounded(r, "capacity_events", 100_000, MAX_CAPACITY_EVENTS),
        when_full=r.choice("when_full", ("block", "shed"), "block"),  # type: ignore[arg-type]
        max_events_per_txn=_bounded(r, "max_events_per_txn", 1000, MAX_EVENTS_PER_TXN),
        max_txn_bytes=_bounded(r, "max_txn_bytes", 64 * 1024 * 1024, MAX_TXN_BYTES),
        linger_ms=_bounded(r, "linger_ms", 0, MAX_LINGER_MS, minimum=0),
        txn_lease_seconds=lease,
        txn_protocol=r.choice(  # type: ignore[arg-type]
            "txn_protocol",
            TXN_PROTOCOLS,
            "auto",
            "auto picks flush where the store can flush transactions, commit where it cannot",
        ),
        segments=_bounded(r, "segments", 1, MAX_SEGMENTS),
        options=spec.load().parse_options(r),
    )
    r.finish("see collectors/collector.example.toml for the settings of each driver")
    return settings


def _stream(r: OptionsReader) -> str:
    stream = r.text("stream")
    if r.has("scope"):
        scope = r.text("scope")
        if "/" in stream:
            r.fail("stream", "is already SCOPE/STREAM", "drop the separate scope setting")
        stream = f"{scope}/{stream}"
    try:
        parse_stream(stream)
    except InvalidName as exc:
        hint = "" if "SCOPE/STREAM" in exc.reason else "use SCOPE/STREAM"
        r.fail("stream", f"is not a valid stream name ({exc.reason})", hint)
    return stream


def _routing_key(r: OptionsReader) -> str | None:
    """The instance's routing key (default: the host name; empty: no key, so its events go
    to any segment), refused here if the store could not hold it, rather than by every
    transaction the sender would try."""
    key = r.text("routing_key", socket.gethostname()) or None
    try:
        check_routing_key(key)
    except InvalidRoutingKey as exc:
        r.fail("routing_key", f"is not a routing key: {exc.reason}")
    return key


def _lease_seconds(r: OptionsReader) -> float:
    key, scale = "txn_lease_seconds", 1.0
    if r.has("transaction_timeout_minutes"):
        key, scale = "transaction_timeout_minutes", 60.0
    seconds = r.number(key, DEFAULT_TXN_LEASE_SECONDS / scale, positive=True) * scale
    if seconds > MAX_TXN_LEASE_SECONDS:
        limit = MAX_TXN_LEASE_SECONDS / scale
        r.fail(key, f"is above the limit of {limit:,.0f}", "a lease of ten years is the longest")
    return seconds


def _bounded(r: OptionsReader, key: str, default: int, limit: int, minimum: int = 1) -> int:
    """A whole number from `minimum` to `limit` (`LIMITS` says why each limit is there)."""
    value = r.integer(key, default, minimum=minimum)
    if value > limit:
        r.fail(key, f"is above the limit of {limit:,}", LIMITS[key])
    return value


def _legacy_settings(r: OptionsReader, notes: list[str]) -> None:
    """Pravega Sensor Collector settings that have no effect here: accepted, and said so at
    start-up."""
    where = r.where
    if r.has("exactly_once") and not r.flag("exactly_once"):
        notes.append(
            f"{where}: {r.origin('exactly_once')}=false ignored: this collector always sends "
            "through transactions (exactly-once)"
        )
    if r.has("create_scope"):
        r.flag("create_scope")
        notes.append(f"{where}: {r.origin('create_scope')} ignored: scopes are always created")
    if r.has("memory_queue_capacity_elements"):
        r.integer("memory_queue_capacity_elements", minimum=1)
        notes.append(
            f"{where}: {r.origin('memory_queue_capacity_elements')} ignored: there is no memory "
            "queue; samples go to the SQLite buffer (see capacity_events)"
        )
    if r.has("enable_large_event") and r.flag("enable_large_event"):
        notes.append(
            f"{where}: {r.origin('enable_large_event')} ignored: events over 8 MiB are split "
            "into smaller ones before they are buffered"
        )


def _check_distinct_buffers(instances: tuple[InstanceSettings, ...]) -> None:
    seen: dict[Path, str] = {}
    for inst in instances:
        other = seen.setdefault(inst.buffer_file, inst.name)
        if other != inst.name:
            msg = f"instance {inst.name}"
            raise ConfigError(
                msg,
                f"buffer_file {inst.buffer_file} is also the buffer of instance {other}",
                "give each instance its own buffer file",
            )
