"""Slices: named, bounded pieces of a stream's history (a pair of stream cuts), stored in a
slices stream so that any job, any machine and any later day can replay exactly them.

A slice is a `SliceRecord` written as one JSON event to the slices stream (default
`sluice/slices`); its `slice_id` is a hash of what the slice is, so recording it twice gives
the same id. Delivery: `record_slices` skips known ids and slices known by what they read
(exactly-once for one writer at a time); readers keep the first record of each id
(`DESIGN.md`, "slices")."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime

from pipeline.errors import SluiceError
from pipeline.streams import (
    Event,
    InvalidCut,
    InvalidName,
    StreamCut,
    StreamStore,
    Truncated,
    parse_stream,
)
from pipeline.streams.names import check_name, check_routing_key

SLICE_VERSION = 1
DEFAULT_SLICES_STREAM = "sluice/slices"


class SliceError(SluiceError):
    """Base of the errors about slices."""


class SliceNotFound(SliceError, LookupError):
    def __init__(self, slice_id: str, slices_stream: str) -> None:
        self.slice_id, self.slices_stream = slice_id, slices_stream
        msg = (
            f"no slice {slice_id!r} in {slices_stream}: list them with "
            "`sluice slices list SCOPE/STREAM` (or pass --slices-stream if they live elsewhere)"
        )
        super().__init__(msg)


class BadSliceRecord(SliceError, ValueError):
    """An event of the slices stream that is not a slice record this Sluice can read."""

    def __init__(self, slices_stream: str, segment: int, offset: int, reason: str) -> None:
        self.slices_stream, self.segment, self.offset = slices_stream, segment, offset
        self.reason = reason
        msg = (
            f"event at {slices_stream} segment {segment} offset {offset} is not a slice "
            f"record: {reason} (was it written by a newer Sluice, or by something else?)"
        )
        super().__init__(msg)


class EmptySlice(SliceError, ValueError):
    """A slice with no event between its cuts: it would replay to nothing."""

    def __init__(self, record: SliceRecord) -> None:
        self.record = record
        sensor = f" of sensor {record.sensor}" if record.sensor is not None else ""
        msg = (
            f"no events of {record.stream}{sensor} between {format_ns(record.start_time_ns)} "
            f"and {format_ns(record.end_time_ns)}: the slice would replay to nothing. Widen "
            "--from/--to (or check --sensor), or pass --allow-empty to record it anyway"
        )
        super().__init__(msg)


class InvalidTimeWindow(SliceError, ValueError):
    def __init__(self, text: str, reason: str) -> None:
        self.text, self.reason = text, reason
        msg = f"invalid time {text!r}: {reason} (use ISO 8601, e.g. 2026-11-01T00:00Z)"
        super().__init__(msg)


class WindowOutOfOrder(SliceError, ValueError):
    """A window whose end (`--to`) is not after its start (`--from`): valid times, in an
    order that leaves [start, end) no time at all. The times are shown as they were given."""

    def __init__(self, start: str, end: str, same: bool) -> None:
        self.start, self.end, self.same = start, end, same
        when = "the same time as" if same else "before"
        msg = (
            f"--to {end} must be after --from {start} (it is {when} --from, so the window "
            "[--from, --to) holds nothing): give a later --to or an earlier --from"
        )
        super().__init__(msg)


def check_window(start_ns: int, end_ns: int, given: tuple[str, str] | None = None) -> None:
    """Refuse (`WindowOutOfOrder`) a window whose end is not after its start; `given`, the
    texts the times were parsed from, are what the message shows (else the times)."""
    if end_ns > start_ns:
        return
    start, end = given or (format_ns(start_ns), format_ns(end_ns))
    raise WindowOutOfOrder(start, end, same=end_ns == start_ns)


@dataclass(frozen=True, slots=True)
class SliceRecord:
    """One slice: events of `stream` between `start_cut` and `end_cut` (stream-cut texts).

    `sensor` names the sensor the slice is about, or is None for every sensor; `sensor_by`
    says what names it: `routing_key`, or comma-separated columns of the flattened rows
    (`RemoteAddr,Interface`, whose values are joined with `/`). `start_time_ns` and
    `end_time_ns` bound the event times of interest, [start, end]; a replay keeps only the
    rows of the sensor inside them.
    """

    slice_id: str
    stream: str
    sensor: str | None
    start_cut: str
    end_cut: str
    start_time_ns: int
    end_time_ns: int
    reason: str
    created_by: str
    sensor_by: str | None = None
    version: int = SLICE_VERSION

    @classmethod
    def create(
        cls,
        *,
        stream: str,
        sensor: str | None,
        start_cut: StreamCut,
        end_cut: StreamCut,
        start_time_ns: int,
        end_time_ns: int,
        reason: str,
        created_by: str,
        sensor_by: str | None = None,
    ) -> SliceRecord:
        sensor_by = sensor_by if sensor is not None else None
        identity = [stream, sensor_by, sensor, start_cut.text, end_cut.text]
        identity += [int(start_time_ns), int(end_time_ns)]
        digest = hashlib.sha256(json.dumps([*identity, reason]).encode()).hexdigest()
        return cls(
            slice_id=f"sl-{digest[:16]}",
            stream=stream,
            sensor=sensor,
            start_cut=start_cut.text,
            end_cut=end_cut.text,
            start_time_ns=int(start_time_ns),
            end_time_ns=int(end_time_ns),
            reason=reason,
            created_by=created_by,
            sensor_by=sensor_by,
        )

    @property
    def cuts(self) -> tuple[StreamCut, StreamCut]:
        return StreamCut.parse(self.start_cut), StreamCut.parse(self.end_cut)

    @property
    def content_key(self) -> tuple:
        """What a replay of the slice reads and keeps: its stream (the stream's identity
        too), sensor, time bounds and reason, and the byte range of each segment it reads
        something of. The positions of segments it reads nothing of are left out: the
        bookmark job puts the stream's head there, which a truncation moves, so the same
        slice found again by a later checkpoint has other cut texts and another id."""
        start, end = self.cuts
        spans = tuple(span for span in start.spans_until(end) if span[2] > span[1])
        bounds = (self.start_time_ns, self.end_time_ns)
        return (
            self.stream,
            start.stream_id,
            self.sensor_by,
            self.sensor,
            bounds,
            self.reason,
            spans,
        )

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_event(cls, event: Event) -> SliceRecord:
        def bad(reason: str) -> BadSliceRecord:
            return BadSliceRecord(event.stream, event.segment, event.offset, reason)

        try:
            data = json.loads(event.payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            msg = f"not JSON ({exc})"
            raise bad(msg) from None
        if not isinstance(data, dict) or data.get("version") != SLICE_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            msg = f"version {version!r}, this Sluice reads version {SLICE_VERSION}"
            raise bad(msg)
        names = {f.name for f in fields(cls)}
        if missing := names - data.keys():
            msg = f"missing {', '.join(sorted(missing))}"
            raise bad(msg)
        if problem := _field_problem(data):
            raise bad(problem)
        return cls(**{k: data[k] for k in names})

    def row(self) -> dict:
        """The record with readable times, for tables and JSON output."""
        return {
            **asdict(self),
            "start_time": format_ns(self.start_time_ns),
            "end_time": format_ns(self.end_time_ns),
            "span": format_span(self.end_time_ns - self.start_time_ns),
        }


#: The JSON types of a slice record's fields (`None` where a field may be null).
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "slice_id": (str,),
    "stream": (str,),
    "sensor": (str, type(None)),
    "start_cut": (str,),
    "end_cut": (str,),
    "start_time_ns": (int,),
    "end_time_ns": (int,),
    "reason": (str,),
    "created_by": (str,),
    "sensor_by": (str, type(None)),
}

_JSON = {str: "a string", int: "a whole number", type(None): "null"}


def _field_problem(data: dict) -> str | None:
    """What is wrong with the fields of a record read back, if anything: a field of another
    type, or a slice id that could not name a directory (a replay writes under it)."""
    for name, types in _FIELD_TYPES.items():
        value = data[name]
        if not isinstance(value, types) or isinstance(value, bool):
            return f"{name} is {json.dumps(value)[:80]}, not {' or '.join(_JSON[t] for t in types)}"
    try:
        check_name("slice id", data["slice_id"])
    except InvalidName as exc:
        return f"slice id {data['slice_id'][:80]!r} cannot name a directory: {exc.reason}"
    return None


@dataclass(frozen=True, slots=True)
class SliceExtent:
    """What a slice holds in the store: the events between its cuts (of its sensor when the
    sensor is a routing key; of every sensor when columns name it, which only a flatten can
    tell apart) and their bytes. A slice the stream was truncated into holds no count:
    `truncated` says what was dropped (it can no longer be replayed whole)."""

    events: int | None
    bytes: int | None
    truncated: str | None = None

    @classmethod
    def of(cls, store: StreamStore, record: SliceRecord) -> SliceExtent:
        by_key = record.sensor is not None and record.sensor_by in (None, "routing_key")
        events = size = 0
        try:
            for event in store.read(record.stream, *record.cuts):
                if by_key and event.routing_key != record.sensor:
                    continue
                events += 1
                size += event.end_offset - event.offset
        except Truncated as exc:
            dropped = (
                f"segment {exc.segment} was truncated at offset {exc.truncated_at},"
                f" past the slice's position {exc.offset}"
            )
            return cls(None, None, dropped)
        return cls(events, size)


# --- times ----------------------------------------------------------------------------------


#: Event times are 64-bit nanoseconds since 1970: a window beyond them can hold no event.
FIRST_NS, LAST_NS = -(2**63), 2**63 - 1
#: The seconds of an ISO 8601 time and their fraction (`12:00:00.123456789`, `120000,5`).
_FRACTION = re.compile(r"[T ]\d{2}(?::?\d{2}){2}([.,])(\d+)")


def parse_time_ns(text: str) -> int:
    """ISO 8601 text to epoch nanoseconds; a time without a zone is taken as UTC. Digits of
    the seconds beyond the microseconds (which `datetime` drops) count, up to nanoseconds;
    a time event times cannot reach (before 1677-09-21, after 2262-04-11) is refused."""
    plain = text.strip()
    found = _FRACTION.search(plain)
    digits = found.group(2) if found else ""
    if len(digits) > 9:
        raise InvalidTimeWindow(text, "more than 9 digits after the seconds (a nanosecond)")
    if found is not None:  # parsed here: `datetime` keeps 6 digits and drops the others
        plain = plain[: found.start(1)] + plain[found.end(2) :]
    if "." in plain or "," in plain:  # `datetime` reads T12.5 as 12:00:00.5, not 12:30
        raise InvalidTimeWindow(text, "a fraction of an hour or minute: give the seconds")
    try:
        moment = datetime.fromisoformat(plain)
    except ValueError as exc:
        raise InvalidTimeWindow(text, str(exc)) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
    ns += int(digits.ljust(9, "0"))
    if not FIRST_NS <= ns <= LAST_NS:
        reason = (
            f"event times are 64-bit nanoseconds since 1970, from {format_ns(FIRST_NS)} "
            f"to {format_ns(LAST_NS)}: no event lies at this time"
        )
        raise InvalidTimeWindow(text, reason)
    return ns


def format_ns(ns: int) -> str:
    moment = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ns % 1_000_000_000:09d}Z"


def format_span(ns: int) -> str:
    """A duration for people: `0.250 s`, `95.000 s` (nanoseconds, rounded to ms)."""
    return f"{ns / 1e9:.3f} s"


# --- the slices stream ----------------------------------------------------------------------


def _events(store: StreamStore, slices_stream: str) -> list[Event]:
    if not store.stream_exists(slices_stream):
        return []
    return list(store.read(slices_stream))


def list_slices(
    store: StreamStore, stream: str | None = None, slices_stream: str = DEFAULT_SLICES_STREAM
) -> list[SliceRecord]:
    """Every slice (of `stream`, if given), first record per id, in the order recorded."""
    seen: dict[str, SliceRecord] = {}
    for event in _events(store, slices_stream):
        record = SliceRecord.from_event(event)
        if record.slice_id not in seen and (stream is None or record.stream == stream):
            seen[record.slice_id] = record
    return list(seen.values())


def recorded_as(
    store: StreamStore, record: SliceRecord, slices_stream: str = DEFAULT_SLICES_STREAM
) -> SliceRecord:
    """The recorded slice that `record_slices` took `record` for (the same id, or the same
    `content_key`): the one replays find. `record` itself if none is recorded."""
    found = _known(_by_identity(list_slices(store, record.stream, slices_stream)), record)
    return record if found is None else found


def _by_identity(records: list[SliceRecord]) -> dict[str | tuple, SliceRecord]:
    """Records by what a slice is known by: its id (text) and its `content_key` (a tuple),
    the first one recorded for each."""
    index: dict[str | tuple, SliceRecord] = {}
    for record in records:
        index.setdefault(record.slice_id, record)
        index.setdefault(record.content_key, record)
    return index


def _known(index: dict[str | tuple, SliceRecord], record: SliceRecord) -> SliceRecord | None:
    """The record of `index` that `record` is: the same id, or the same `content_key`."""
    return index.get(record.slice_id) or index.get(record.content_key)


def find_slice(
    store: StreamStore, slice_id: str, slices_stream: str = DEFAULT_SLICES_STREAM
) -> SliceRecord:
    for record in list_slices(store, None, slices_stream):
        if record.slice_id == slice_id:
            return record
    raise SliceNotFound(slice_id, slices_stream)


def check_cuts(record: SliceRecord) -> None:
    """Raise `InvalidCut` unless the record's cuts parse, are cuts of its stream, and its end
    cut is nowhere before its start cut (a segment a cut does not name is at its beginning)."""
    scope, name = parse_stream(record.stream)
    start, end = (cut.check_stream(scope, name) for cut in record.cuts)
    begin, finish = start.segments, end.segments
    for seg in sorted(begin.keys() | finish.keys()):
        if finish.get(seg, 0) < begin.get(seg, 0):
            reason = f"slice {record.slice_id} ends before it starts, in segment {seg}"
            raise InvalidCut(end.text, reason)


def record_slices(
    store: StreamStore,
    records: list[SliceRecord],
    slices_stream: str = DEFAULT_SLICES_STREAM,
) -> list[SliceRecord]:
    """Append the records that are new, in one transaction; return those written. A record
    is known by its id, or by its `content_key` (the same slice recorded with its idle
    segments at other positions: by a bookmark checkpoint made again after the stream was
    truncated). A record whose cuts are not a range of its stream is refused (`InvalidCut`)
    first."""
    parse_stream(slices_stream)
    for record in records:
        check_cuts(record)
    store.create_stream(slices_stream)
    known = _by_identity(list_slices(store, None, slices_stream))
    new: list[SliceRecord] = []
    for record in records:
        if _known(known, record) is None:
            known |= _by_identity([record])
            new.append(record)
    if not new:
        return []
    txn = store.begin_transaction(slices_stream)
    try:
        for record in new:
            txn.write(record.to_json(), routing_key=record.stream)
        txn.flush()
    except BaseException:
        txn.abort()
        raise
    txn.commit()
    return new


def time_window_slice(
    store: StreamStore,
    stream: str,
    start_ns: int,
    end_ns: int,
    *,
    sensor: str | None = None,
    sensor_by: str = "routing_key",
    created_by: str = "sluice slices create",
) -> SliceRecord:
    """The slice of `stream` holding every event whose time bounds meet [start, end).

    The cuts come from `store.time_cuts` (the time bounds writers attach at commit); the
    slice's time bounds are the window itself, so a replay keeps only samples inside it.
    """
    for name, ns, last in (("--from", start_ns, LAST_NS), ("--to", end_ns, LAST_NS + 1)):
        if not FIRST_NS <= ns <= last:  # (--to is exclusive: the last nanosecond + 1)
            reason = f"{name} is {ns} ns since 1970, beyond 64-bit nanoseconds (event times)"
            raise InvalidTimeWindow(str(ns), reason)
    check_window(start_ns, end_ns)
    if sensor is not None and sensor_by == "routing_key":
        check_routing_key(sensor)  # one no event can carry: a clear error, not an empty slice
    start_cut, end_cut = store.time_cuts(stream, start_ns, end_ns)
    reason = f"time window {format_ns(start_ns)} .. {format_ns(end_ns)}"
    return SliceRecord.create(
        stream=stream,
        sensor=sensor,
        start_cut=start_cut,
        end_cut=end_cut,
        start_time_ns=start_ns,
        end_time_ns=end_ns - 1,
        reason=reason,
        created_by=created_by,
        sensor_by=sensor_by,
    )
