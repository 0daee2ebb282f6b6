"""The options of the `sluice` data sources, validated once into typed objects on the driver.

Spark hands a data source its options as a case-insensitive map of strings. They are parsed
here, in the driver, and the resulting frozen objects (picklable) travel to the executors, so a
bad option is one clear error before any task runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.spark.errors import OptionError
from pipeline.streams import (
    InvalidCut,
    InvalidName,
    InvalidRoutingKey,
    NoStore,
    StreamCut,
    StreamStore,
    open_store,
    parse_stream,
)
from pipeline.streams.names import check_routing_key

SOURCE = "sluice"
EXPORT = "sluice-export"
SINK_STATE_FILE = "sluice-sink.sqlite"

CommitMode = Literal["auto", "tasks", "driver"]
COMMIT_MODES: tuple[CommitMode, ...] = ("auto", "tasks", "driver")


def _get(options: Mapping[str, str], key: str) -> str | None:
    value = options.get(key.lower())
    if value is None:
        value = options.get(key)
    return None if value is None or str(value).strip() == "" else str(value).strip()


def _exact(options: Mapping[str, str], key: str) -> str | None:
    """The option as given, white space and the empty text included (a routing key is
    compared as it is: `pipeline/streams/names.py`); None when it is not given."""
    value = options.get(key.lower())
    if value is None:
        value = options.get(key)
    return None if value is None else str(value)


def _routing_key(options: Mapping[str, str]) -> str | None:
    key = _exact(options, "routingKey")
    try:
        return check_routing_key(key)
    except InvalidRoutingKey as exc:
        raise OptionError(SOURCE, "routingKey", key, exc.reason) from None


def _stream(source: str, options: Mapping[str, str], key: str = "stream") -> str:
    value = _get(options, key)
    if value is None:
        raise OptionError(source, key, None, "name the stream as SCOPE/STREAM")
    try:
        parse_stream(value)
    except InvalidName as exc:
        raise OptionError(source, key, value, str(exc)) from None
    return value


def _store(options: Mapping[str, str]) -> str:
    """The store URI, resolved on the driver: executors may not share its environment."""
    from pipeline.config import default_store_uri

    return _get(options, "store") or default_store_uri()


def source_store(uri: str) -> StreamStore:
    """The store a `sluice` source reads (its `store` option, or the store a range row names),
    which must exist: a misspelt path is an error, not a new empty store left behind."""
    try:
        return open_store(uri, must_exist=True)
    except NoStore as missing:
        reason = f"no store at {missing.directory}: nothing was ever written there"
        raise OptionError(SOURCE, "store", uri, reason) from None


def _positive(source: str, options: Mapping[str, str], key: str, default: int | None) -> int | None:
    value = _get(options, key)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise OptionError(source, key, value, "expected a positive whole number")
    return number


def _state(options: Mapping[str, str]) -> str | None:
    """The batch-ledger file: `state`, else next to a local `checkpointLocation`."""
    state = _get(options, "state")
    checkpoint = _get(options, "checkpointLocation")
    if state is None and checkpoint is not None and "://" not in checkpoint:
        state = str(Path(checkpoint.removeprefix("file:")) / SINK_STATE_FILE)
    return state


def cut_option(stream: str, text: str, option: str) -> StreamCut | None:
    """A cut option's text (`startingCut`, `endingCut`) as a cut of `stream`; None for `head`,
    `tail` or `latest`, which only the store can resolve. A text that is no cut, or a cut of
    another stream, is an `OptionError`: pyspark-free, so a job checks `--from` with the
    source's own words before Spark starts."""
    if text.lower() in ("head", "tail", "latest"):
        return None
    try:
        scope, name = parse_stream(stream)
        return StreamCut.parse(text).check_stream(scope, name)
    except InvalidCut as exc:
        raise OptionError(SOURCE, option, text, f"{exc} (or use head / tail)") from None


def resolve_cut(store: StreamStore, stream: str, text: str, option: str) -> StreamCut:
    """`head`, `tail` or a cut's text, as a cut of `stream` (pyspark-free: a job checks
    `--from` with it before Spark starts, as the source reads it)."""
    cut = cut_option(stream, text, option)
    if cut is not None:  # of this very stream, not of an earlier one of its name (`StaleCut`)
        return cut.check_same_stream(store.head(stream))
    return store.head(stream) if text.lower() == "head" else store.tail(stream)


def _batch_id(source: str, options: Mapping[str, str]) -> int | None:
    batch = _get(options, "batchId")
    if batch is not None and not batch.isdigit():
        raise OptionError(source, "batchId", batch, "expected a whole number")
    return int(batch) if batch is not None else None


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Options of a `sluice` read (batch or streaming).

    `starting` / `ending` are `head`, `tail` or a cut's text; `ending` None means the tail at
    planning time for a batch read, and no end for a streaming read. `emit` is `events` (one
    row per event) or `ranges` (one row per planned segment range, for a sink that reads the
    store itself, such as `sluice-export`: the payloads then never cross the JVM).
    """

    store: str
    stream: str
    starting: str = "head"
    ending: str | None = None
    max_events: int | None = None
    max_bytes: int | None = None
    min_partitions: int = 2
    min_split_bytes: int = 1 << 20
    emit: Literal["events", "ranges"] = "events"
    stop_request: str | None = None
    stop_seen: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        emit = (_get(options, "emit") or "events").lower()
        if emit not in ("events", "ranges"):
            raise OptionError(SOURCE, "emit", emit, "use events (the default) or ranges")
        return cls(
            store=_store(options),
            stream=_stream(SOURCE, options),
            starting=_get(options, "startingCut") or "head",
            ending=_get(options, "endingCut"),
            max_events=_positive(SOURCE, options, "maxEventsPerTrigger", None),
            max_bytes=_positive(SOURCE, options, "maxBytesPerTrigger", None),
            min_partitions=_positive(SOURCE, options, "minPartitions", 2) or 2,
            min_split_bytes=_positive(SOURCE, options, "minSplitBytes", 1 << 20) or 1 << 20,
            emit="ranges" if emit == "ranges" else "events",
            stop_request=_get(options, "stopRequest"),
            stop_seen=_get(options, "stopSeen"),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Options of a `sluice` write: the target stream and where batch ids are recorded.

    `state` is the SQLite file that records each committed batch (streaming writes:
    `<checkpointLocation>/sluice-sink.sqlite` unless given). A batch write without `state`
    and `batchId` is exactly-once only while its driver lives (see `writing.py`).
    `commit_mode` (option `commitMode`) says who writes the transactions: `tasks` (each task
    its own, flushed before the driver commits), `driver` (one per batch, written by the
    driver: for stores that cannot flush a transaction, such as Pravega), or `auto` (the
    default, resolved by `SluiceDataSource` from the target store's features).
    """

    store: str
    stream: str
    routing_key: str | None
    state: str | None
    batch_id: int | None
    create_segments: int | None
    commit_mode: CommitMode = "auto"

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        mode = (_get(options, "commitMode") or "auto").lower()
        if mode not in COMMIT_MODES:
            raise OptionError(SOURCE, "commitMode", mode, "use auto (the default), tasks or driver")
        return cls(
            store=_store(options),
            stream=_stream(SOURCE, options),
            routing_key=_routing_key(options),
            state=_state(options),
            batch_id=_batch_id(SOURCE, options),
            create_segments=_positive(SOURCE, options, "createSegments", None),
            commit_mode=mode,  # type: ignore[arg-type]
        )


@dataclass(frozen=True, slots=True)
class ExportOptions:
    """Options of a `sluice-export` write: schema, output directory, formats, file size."""

    schema: str
    output: str
    formats: tuple[str, ...]
    max_rows_per_file: int
    time_field: str | None
    state: str | None
    batch_id: int | None

    FORMATS = ("parquet", "csv", "jsonl")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ExportOptions:
        schema = _get(options, "schema")
        if schema is None:
            raise OptionError(EXPORT, "schema", None, "name a bundled schema or an .avsc path")
        output = _get(options, "output") or _get(options, "path")
        if output is None:
            raise OptionError(EXPORT, "output", None, "give the output directory")
        listed = (_get(options, "formats") or "parquet").split(",")
        formats = tuple(f.strip().lower() for f in listed if f.strip())
        unknown = [f for f in formats if f not in cls.FORMATS]
        if unknown or not formats:
            reason = f"known formats are {', '.join(cls.FORMATS)}"
            raise OptionError(EXPORT, "formats", ",".join(formats), reason)
        return cls(
            schema=schema,
            output=str(Path(output.removeprefix("file:")).absolute()),
            formats=formats,
            max_rows_per_file=_positive(EXPORT, options, "maxRowsPerFile", 1_000_000) or 1,
            time_field=_get(options, "timeField"),
            state=_state(options),
            batch_id=_batch_id(EXPORT, options),
        )
