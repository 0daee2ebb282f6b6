"""Flatten a batch of JSON events into Arrow rows through a `FlattenPlan`; quarantine the bad.

Runs in Spark executors and must be fast: simdjson parses each event whole, its scalars
checked as msgspec would decode them and its number arrays turned straight into buffers of
machine numbers; where the plan or an event needs more, msgspec decodes each event into a typed
struct whose number arrays stay raw JSON text, which simdjson then parses; anything unusual
sends the batch event by event, through a strict decoder where needed, which gives the exact
answer, the same as the fast paths would. An event that is not
UTF-8 or JSON, misses a field, has a wrong type, unequal parallel arrays or an event time
that nanoseconds cannot hold is quarantined with its payload, position and reason, never
dropped (`DESIGN.md`). The rows and the quarantine are made into Arrow tables by `tables.py`."""

from __future__ import annotations

import keyword
import sys
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import simdjson

from pipeline.schemas.plan import FLOAT32_MAX, NUMERIC, Column, FlattenPlan
from pipeline.schemas.tables import (
    NUMPY_TYPES,
    Events,
    Flattened,
    GoodEvents,
    placeable,
    quarantine_table,
    rows_table,
    sample_column,
)

#: simdjson's buffer type for each Avro number: int64 ("i") or float64 ("d"), as `NUMPY_TYPES`.
_BUFFER = {"int": "i", "long": "i", "float": "d", "double": "d"}
_I32 = np.iinfo(np.int32)


class _FastPathMiss(Exception):
    """The fast path cannot vouch for this event; decode it strictly."""


class _Quarantine(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Columns:
    """Per-column accumulators for the events that flattened cleanly, one at a time."""

    def __init__(self, plan: FlattenPlan) -> None:
        self.plan = plan
        self.values: dict[str, list] = {c.name: [] for c in plan.columns}
        self.counts: list[int] = []
        self.good: list[int] = []

    def add(self, index: int, count: int, values: dict[str, Any]) -> None:
        for name, value in values.items():
            self.values[name].append(value)
        self.counts.append(count)
        self.good.append(index)

    def good_events(self) -> GoodEvents:
        counts = np.asarray(self.counts, dtype=np.int64)
        scalars, samples = {}, {}
        for column in self.plan.columns:
            values = self.values[column.name]
            if column.kind == "scalar":
                scalars[column.name] = values
            else:
                samples[column.name] = sample_column(column, values, counts)
        return GoodEvents(np.asarray(self.good, dtype=np.int64), counts, scalars, samples)


def flatten(plan: FlattenPlan, events: Events, *, dictionary: bool = False) -> Flattened:
    """Flatten `events` (see the module doc); never raises for a bad event.

    `dictionary=True` returns the per-event columns (scalars, `_segment`, `_offset`) as
    Arrow dictionary arrays over their distinct values instead of repeating each value on
    every row of its event: the same values, and Parquet writes them as dictionary pages as is.
    """
    bad: list[tuple[int, str]] = []
    good = _all_at_once(plan, events.payloads)
    if good is None:
        good = _one_by_one(plan, events.payloads, bad)
    good = placeable(plan, good, bad)
    rows, time_ns = rows_table(plan, events, good, dictionary)
    return Flattened(rows, time_ns, quarantine_table(plan, events, bad), len(events.payloads))


def _one_by_one(
    plan: FlattenPlan, payloads: Sequence[bytes | None], bad: list[tuple[int, str]]
) -> GoodEvents:
    """Each event on its own: the exact answer for any event, rows or a quarantine reason."""
    acc = _Columns(plan)
    for index, payload in enumerate(payloads):
        try:
            count, values = _event(plan, payload)
        except _Quarantine as exc:
            bad.append((index, exc.reason))
            continue
        acc.add(index, count, values)
    return acc.good_events()


def _all_at_once(plan: FlattenPlan, payloads: Sequence[bytes | None]) -> GoodEvents | None:
    """Every event at once, column by column (`DESIGN.md`, "All at once"), or None when any
    event needs a closer look: the batch then goes one event at a time, which gives the same
    rows for the good events and a reason for each bad one."""
    if not _batchable(plan, payloads):
        return None
    good = _read_whole(plan, payloads)
    return good if good is not None else _decoded_at_once(plan, payloads)


def _batchable(plan: FlattenPlan, payloads: Sequence[bytes | None]) -> bool:
    """Whether a batch may go all at once: the plan's arrays all of numbers, every event
    UTF-8 and its arrays flat."""
    if not payloads or not _columnar(plan):
        return False
    for payload in payloads:
        if payload is None or not (payload.isascii() or _utf8(payload)):
            return False
    return _flat_arrays(plan, payloads)


def _decoded_at_once(plan: FlattenPlan, payloads: Sequence[bytes]) -> GoodEvents | None:
    """Each event decoded by msgspec (its number arrays kept as raw text), each scalar column
    gathered, each array parsed by simdjson."""
    try:
        decoded = [plan.fast.decode(payload) for payload in payloads]
        scalars = {c.name: _scalars(c, decoded) for c in plan.columns if c.kind == "scalar"}
    except (msgspec.DecodeError, msgspec.ValidationError, _FastPathMiss, RecursionError):
        return None
    parser = simdjson.Parser()
    buffers: dict[tuple[str, ...], list[memoryview]] = {}
    for path, avro in plan.number_arrays.items():
        raws = [_get(obj, path) for obj in decoded]
        if not all(isinstance(raw, msgspec.Raw) for raw in raws):
            return None  # an optional array: decoded as a list or None
        try:
            buffers[path] = [_number_buffer(parser, raw, avro) for raw in raws]
        except _FastPathMiss:
            return None
    return _gathered(plan, len(payloads), scalars, buffers)


def _gathered(
    plan: FlattenPlan,
    events: int,
    scalars: dict[str, list],
    buffers: dict[tuple[str, ...], list[memoryview]],
) -> GoodEvents | None:
    """The batch from each scalar column's values and each number array's buffers (one per
    event, `_number_buffer`'s): each array's buffers joined, so the values come out
    concatenated and each event's count is its buffer's size; None when the parallel arrays'
    counts differ or a value does not fit its Avro type."""
    counts = np.ones(events, dtype=np.int64)  # an event without arrays is one row
    numbers: dict[tuple[str, ...], np.ndarray] = {}
    for path, avro in plan.number_arrays.items():
        joined = _joined(buffers[path], avro)
        if joined is None or (numbers and not np.array_equal(joined[1], counts)):
            return None
        numbers[path], counts = joined
    samples = {c.name: _typed(c, numbers[c.array_path]) for c in plan.columns if c.kind == "sample"}
    return GoodEvents(np.arange(events, dtype=np.int64), counts, scalars, samples)


#: The Avro types of the scalars `_read_whole` reads, as simdjson gives them (`type(value)`).
_WHOLE = {"string": str, "boolean": bool, "int": int, "long": int, "double": float, "float": float}
_RANGE = {
    "int": (_I32.min, _I32.max),
    "long": (-(2**63), 2**63 - 1),
    "float": (-FLOAT32_MAX, FLOAT32_MAX),
    "double": (-float("inf"), float("inf")),
}


def _read_whole(plan: FlattenPlan, payloads: Sequence[bytes]) -> GoodEvents | None:
    """Every event parsed once, whole, by simdjson (its scalars and its number arrays), when
    the plan's scalars are all required strings, booleans and numbers at plain JSON names;
    None when the plan or any event needs more (then msgspec decodes the batch).

    It gives what msgspec's decode and the arrays' parse give, without msgspec's pass over
    every byte of the arrays, which it only skips (`DESIGN.md`, "Whole events"): each value
    must have its type exactly (an int is no bool; a long, an int fit their ranges; a double
    takes a whole number too), and an object with a key twice goes to msgspec (it keeps the
    last, simdjson the first)."""
    scalars = [c for c in plan.columns if c.kind == "scalar"]
    paths = [c.path for c in scalars] + list(plan.number_arrays)
    if not all(c.avro in _WHOLE and not c.nullable for c in scalars) or not all(
        _plain_name(name) for path in paths for name in path
    ):
        return None
    values: dict[str, list] = {c.name: [] for c in scalars}
    buffers: dict[tuple[str, ...], list] = {path: [] for path in plan.number_arrays}
    parser = simdjson.Parser()
    try:
        for payload in payloads:
            doc = parser.parse(payload)
            _unique_keys(doc)
            for column in scalars:
                value = _scalar_at(doc, column)
                if value is None:
                    return None
                values[column.name].append(value)
            for path, avro in plan.number_arrays.items():
                array = _member(doc, path)
                if not isinstance(array, simdjson.Array):
                    return None
                buffers[path].append(memoryview(array.as_buffer(of_type=_BUFFER[avro])))
                del array
            del doc  # (simdjson refuses to parse again while a value of the last parse lives)
    except (TypeError, ValueError, RuntimeError, KeyError):  # not an object, a bad value
        return None
    return _gathered(plan, len(payloads), values, buffers)


def _plain_name(name: str) -> bool:
    """Whether a path's attribute is the JSON name itself (`plan._attr` renames keywords)."""
    return not (name.endswith("_") and keyword.iskeyword(name[:-1]))


def _member(doc: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` of a parsed event (the event checked by `_unique_keys` already),
    each object below it checked on the way; `KeyError` when it is missing."""
    obj = doc
    for depth, name in enumerate(path):
        if depth:
            _unique_keys(obj)
        obj = obj[name]
    return obj


def _unique_keys(obj: Any) -> None:
    """`TypeError` for a value that is not an object, `KeyError` for one with a key twice."""
    if not isinstance(obj, simdjson.Object):
        raise TypeError(obj)
    if len(set(obj.keys())) != len(obj):
        raise KeyError(obj)


def _scalar_at(doc: Any, column: Column) -> Any:
    """A scalar's value as msgspec decodes it, or None when only msgspec can say."""
    value = _member(doc, column.path)
    kind = type(value)
    if kind is int and column.avro in ("double", "float"):
        value, kind = float(value), float  # as msgspec reads a whole number (`-0` too: 0.0)
    if kind is not _WHOLE[column.avro]:
        return None
    if column.avro in _RANGE:
        low, high = _RANGE[column.avro]
        return value if low <= value <= high else None
    return value


def _columnar(plan: FlattenPlan) -> bool:
    """Whether every array of the plan is a required array of numbers: the fast decoder keeps
    those as raw JSON text, the only arrays `_all_at_once` handles (an optional one, or one
    of optional numbers, decodes as a list)."""
    samples = [c for c in plan.columns if c.kind == "sample"]
    numbers = all(path in plan.number_arrays for path in plan.arrays)
    return numbers and not any(c.nullable for c in samples)


def _utf8(payload: bytes) -> bool:
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _scalars(column: Column, decoded: list) -> list:
    """One scalar column's value for each decoded event."""
    if len(column.path) == 1:
        values = list(map(attrgetter(column.path[0]), decoded))
    else:
        values = [_get(obj, column.path) for obj in decoded]
    if column.avro in ("bytes", "fixed", "map"):
        return [_scalar(column, value) for value in values]
    return values


def _flat_arrays(plan: FlattenPlan, payloads: Sequence[bytes]) -> bool:
    """Whether every event holds exactly one `[` per array of the plan: then its arrays hold
    no arrays (simdjson's buffers flatten nested ones). A `[` inside a string only sends the
    batch one event at a time."""
    brackets = len(plan.arrays)
    return all(_holds(payload, b"[", brackets) for payload in payloads)


def _holds(text: bytes, char: bytes, times: int) -> bool:
    """Whether `text` holds `char` exactly `times` times, by `find` (memchr's speed; a
    one-byte `count` walks the text byte by byte)."""
    at = -1
    for _ in range(times):
        at = text.find(char, at + 1)
        if at < 0:
            return False
    return text.find(char, at + 1) < 0


def _joined(buffers: list[memoryview], avro: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Each event's buffer of numbers joined: the values and each event's count, or None
    when a value does not fit the Avro type (`_plain`)."""
    counts = np.fromiter((b.nbytes for b in buffers), dtype=np.int64, count=len(buffers)) // 8
    values = np.frombuffer(b"".join(buffers), dtype=NUMPY_TYPES[avro])
    if not _plain(values, avro):
        return None
    return values, counts


def _number_buffer(parser: simdjson.Parser, raw: msgspec.Raw | bytes, avro: str) -> memoryview:
    """One JSON array's numbers as 8-byte machine numbers, exactly as JSON reads them; raises
    `_FastPathMiss` for anything else: not an array, a value that is not a number of this
    type (a fraction or exponent in an int array, null, a string, true), or out of range."""
    try:
        array = parser.parse(raw)
        if not isinstance(array, simdjson.Array):
            raise _FastPathMiss(avro)
        return memoryview(array.as_buffer(of_type=_BUFFER[avro]))
    except (TypeError, ValueError, RuntimeError):  # simdjson's type, range and big-int errors
        raise _FastPathMiss(avro) from None


def _plain(values: np.ndarray, avro: str) -> bool:
    """Whether the values fit the Avro type as JSON reads them: an Avro int in 32 bits, a
    double finite, a float finite in 32 bits (simdjson refuses an int64's overflow and an
    infinite double already)."""
    if not values.size:
        return True
    if avro == "int":
        return bool(values.min() >= _I32.min and values.max() <= _I32.max)
    if avro == "float":
        return bool(values.min() >= -FLOAT32_MAX and values.max() <= FLOAT32_MAX)
    return avro == "long" or bool(np.isfinite(values).all())


def _typed(column: Column, values: np.ndarray) -> pa.Array:
    kind = column.arrow_type
    return pa.array(values.astype(kind.to_pandas_dtype(), copy=False), type=kind)


def _event(plan: FlattenPlan, payload: bytes | None) -> tuple[int, dict[str, Any]]:
    if not payload:
        reason = "invalid JSON: the event is empty"
        raise _Quarantine(reason)
    if not payload.isascii():
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"not UTF-8: {exc}"
            raise _Quarantine(reason) from None
    try:
        return _values(plan, plan.fast.decode(payload))
    except (msgspec.DecodeError, msgspec.ValidationError, _FastPathMiss, RecursionError):
        pass
    try:
        decoded = plan.strict.decode(payload)
    except RecursionError:
        return _deep(plan, payload)
    except msgspec.ValidationError as exc:
        raise _Quarantine(_validation_reason(plan, str(exc))) from None
    except msgspec.DecodeError as exc:
        reason = f"invalid JSON: {exc}"
        raise _Quarantine(reason) from None
    try:
        return _values(plan, decoded)
    except _FastPathMiss as exc:  # a bytes value out of Latin-1: a wrong type in Avro JSON
        reason = f"wrong type: {exc}"
        raise _Quarantine(reason) from None


def _deep(plan: FlattenPlan, payload: bytes) -> tuple[int, dict[str, Any]]:
    """An event too deep for msgspec (Python's recursion limit): what the whole-event read
    gives (simdjson takes 1024 levels), so that its answer does not depend on the other
    events of its batch; else quarantined."""
    good = _read_whole(plan, [payload]) if _batchable(plan, [payload]) else None
    if good is None:
        limit = sys.getrecursionlimit()
        reason = f"nested too deeply: more levels than the decoder takes (about {limit})"
        raise _Quarantine(reason)
    values = {name: column[0] for name, column in good.scalars.items()}
    values |= {name: array.to_numpy() for name, array in good.samples.items()}
    return int(good.counts[0]), values


def _validation_reason(plan: FlattenPlan, message: str) -> str:
    if "missing required field" in message:  # msgspec: "Object missing required field `x`"
        field = message.removeprefix("Object missing required field ")
        return f"missing required field: {field} (schema {plan.name})"
    return f"wrong type: {message} (schema {plan.name})"


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for attr in path:
        if obj is None:
            return None
        obj = getattr(obj, attr)
    return obj


def _values(plan: FlattenPlan, obj: Any) -> tuple[int, dict[str, Any]]:
    """The row count of one decoded event and each column's value (scalar) or values."""
    arrays = {path: _array(plan, path, _get(obj, path)) for path in plan.arrays}
    lengths = {path: len(value) for path, value in arrays.items() if value is not None}
    if len(set(lengths.values())) > 1:
        sizes = ", ".join(f"{'_'.join(p)} has {n}" for p, n in lengths.items())
        reason = f"unequal arrays: {sizes} items (schema {plan.name})"
        raise _Quarantine(reason)
    count = next(iter(lengths.values()), 1)
    values: dict[str, Any] = {}
    for column in plan.columns:
        if column.kind == "scalar":
            values[column.name] = _scalar(column, _get(obj, column.path))
        else:
            values[column.name] = _samples(column, arrays[column.array_path])
    return count, values


def _array(plan: FlattenPlan, path: tuple[str, ...], value: Any) -> Any:
    """A parallel array as decoded; raw JSON numbers are parsed here, once."""
    if isinstance(value, msgspec.Raw):
        return _numbers(value, plan.number_arrays[path])
    return value


def _scalar(column: Column, value: Any) -> Any:
    if value is None:
        return None
    if column.avro in ("bytes", "fixed"):
        try:
            return value.encode("latin-1")
        except UnicodeEncodeError:
            msg = f"{column.name}: Avro bytes in JSON are characters U+0000..U+00FF"
            raise _FastPathMiss(msg) from None
    if column.avro == "map":
        return msgspec.json.encode(value).decode()
    return value


def _samples(column: Column, array: Any) -> Any:
    """One event's values of a sample column: a numpy array for numbers, else a list."""
    if array is None or isinstance(array, np.ndarray):
        return array
    if column.avro in NUMERIC and not column.path and None not in array:
        return np.array(array, dtype=NUMPY_TYPES[column.avro])
    return [_scalar(column, _get(item, column.path)) for item in array]


def _numbers(raw: msgspec.Raw, avro: str) -> np.ndarray:
    """One event's JSON array of numbers (already checked as JSON by msgspec) as numpy."""
    if not _holds(bytes(raw), b"[", 1):
        raise _FastPathMiss(avro)  # not an array, or one holding arrays
    values = np.frombuffer(_number_buffer(simdjson.Parser(), raw, avro), dtype=NUMPY_TYPES[avro])
    if not _plain(values, avro):
        raise _FastPathMiss(avro)
    return values
