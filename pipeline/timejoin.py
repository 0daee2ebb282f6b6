"""The deterministic time-series join of two sensor series: each record with its nearest
predecessor and successor in the other series, each pair once, vectorized with numpy.

The join of the Stateful Stream Processor's LocalStreamBuffer
(<https://github.com/ChristophSchranz/StatefulStreamProcessor>), except that an equal-time
pair is emitted once. `join_tables` joins two tables (files: `sluice join`), `StreamingJoin`
takes them in batches and emits the same rows in the same order (`sluice run join`); the
replay model `pipeline.models.join:join` runs it over a slice. What a pair is, ties, ends,
row order and how it is computed: `TIMEJOIN.md`.

Columns cross between Arrow and numpy through their buffers (`_numbers`, `_indices`): Arrow's
own conversions import pandas, which would be most of a `sluice join` process's time."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa

from pipeline import durable
from pipeline.errors import SluiceError
from pipeline.outputs import check_writable, refusal
from pipeline.wording import agreeing, counted

Side = Literal["left", "right"]
OutputFormat = Literal["parquet", "csv"]
STATE_VERSION = 1
NS = 1_000_000_000
#: What running `join_files` again does after its disk refused the output (`OutputNotWritable`)
RERUN = "the output file is written whole or not at all"
#: The output's format by its extension (lower case), as the inputs are read (`read_series`)
OUTPUT_FORMATS: dict[str, OutputFormat] = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


class JoinInputError(SluiceError, ValueError):
    """A join input that cannot be joined: missing file or column, bad times."""

    def __init__(self, source: str, reason: str) -> None:
        self.source, self.reason = source, reason
        msg = f"cannot join {source}: {reason}"
        super().__init__(msg)


class JoinOutputError(SluiceError, ValueError):
    """A join output that cannot be written: one of the inputs, a directory, a file type
    other than Parquet or CSV, or columns that CSV cannot hold."""

    def __init__(self, output: str, reason: str) -> None:
        self.output, self.reason = output, reason
        msg = f"cannot write the join to {output}: {reason}"
        super().__init__(msg)


class InvalidMaxGap(SluiceError, ValueError):
    """`max_gap` must be a finite number of seconds, zero or more."""

    def __init__(self, max_gap: float) -> None:
        self.max_gap = max_gap
        msg = f"max gap {max_gap!r}: give a finite number of seconds, zero or more (--max-gap)"
        super().__init__(msg)


def check_max_gap(max_gap: float | None) -> float | None:
    """`max_gap` if it is None or a finite number >= 0; else `InvalidMaxGap`."""
    if max_gap is not None and (not math.isfinite(max_gap) or max_gap < 0):
        raise InvalidMaxGap(max_gap)
    return max_gap


class SeriesOutOfOrder(SluiceError, ValueError):
    """A streaming join was fed a record earlier than one already given for that series."""

    def __init__(self, side: str, previous: float, time: float) -> None:
        self.side, self.previous, self.time = side, previous, time
        msg = (
            f"the {side} series went back in time ({time!r} after {previous!r}): each series "
            "must arrive in time order (one routing key per series keeps it so); "
            "sort it or use join_tables on the whole series"
        )
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class JoinPairs:
    """Row numbers (in time order) of each pair, and the pair's completion time."""

    left: np.ndarray
    right: np.ndarray
    completion: np.ndarray

    def __len__(self) -> int:
        return len(self.left)


@dataclass(frozen=True, slots=True)
class JoinResult:
    table: pa.Table
    pairs: int
    left_rows: int
    right_rows: int
    left_unmatched: int
    right_unmatched: int

    def as_dict(self) -> dict[str, int]:
        return {
            "pairs": self.pairs,
            "left_rows": self.left_rows,
            "right_rows": self.right_rows,
            "left_unmatched": self.left_unmatched,
            "right_unmatched": self.right_unmatched,
        }


# --- the vectorized core --------------------------------------------------------------------


def _group_starts(times: np.ndarray) -> np.ndarray:
    """For each record of a sorted series, the row where its equal-time group starts."""
    rows = np.arange(len(times), dtype=np.int64)
    new_group = np.ones(len(times), dtype=bool)
    new_group[1:] = times[1:] != times[:-1]
    return np.maximum.accumulate(np.where(new_group, rows, 0)) if len(times) else rows


def _partner_ranges(
    own: np.ndarray, other: np.ndarray, inclusive: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per record of `own`, the range [lo, hi) of `other` records it completes a pair with.

    `inclusive` takes partners at the record's own time too (the right series completes
    equal-time pairs); otherwise only strictly earlier partners.
    """
    at_or_before = np.searchsorted(other, own, side="right")
    hi = at_or_before if inclusive else np.searchsorted(other, own, side="left")
    # lo: just after the other series' records at or before the own previous group's time,
    # which is `at_or_before` of the last record of that previous group.
    starts = _group_starts(own)
    lo = np.where(starts > 0, at_or_before[np.maximum(starts - 1, 0)], 0)
    # An empty window means the record is nobody's successor: its partner at or before it
    # is its predecessor group alone (if that group is not at its own time, when exclusive).
    empty = (lo == hi) & (hi > 0)
    if not inclusive:
        empty &= hi == at_or_before
    lo[empty] = _group_starts(other)[hi[empty] - 1]
    return lo, hi


def _expand(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(owner, partner) index arrays for every partner in each owner's range."""
    counts = hi - lo
    owner = np.repeat(np.arange(len(lo), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    partner = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts - lo, counts)
    return owner, partner


def _as_sorted_times(times: np.ndarray | Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(times)
    if arr.dtype.kind not in "iuf":
        reason = f"its times are of type {arr.dtype}, not numbers"
        raise JoinInputError(name, reason)
    if arr.dtype.kind == "u":
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        reason = f"{int(np.isnan(arr).sum())} time(s) are NaN: drop or fix those records first"
        raise JoinInputError(name, reason)
    if arr.dtype.kind == "f" and np.isinf(arr).any():
        count = int(np.isinf(arr).sum())
        reason = f"{count} time(s) are infinite: drop or fix those records first"
        raise JoinInputError(name, reason)
    if len(arr) > 1 and not (arr[1:] >= arr[:-1]).all():
        reason = "its times are not in ascending order (use join_tables, which sorts)"
        raise JoinInputError(name, reason)
    return arr


def join_indices(
    left_times: np.ndarray | Sequence[float],
    right_times: np.ndarray | Sequence[float],
    max_gap: float | None = None,
) -> JoinPairs:
    """The pairs of two time-sorted series, as row numbers, in the documented row order."""
    check_max_gap(max_gap)
    lt = _as_sorted_times(left_times, "the left series")
    rt = _as_sorted_times(right_times, "the right series")
    l_lo, l_hi = _partner_ranges(lt, rt, inclusive=False)
    r_lo, r_hi = _partner_ranges(rt, lt, inclusive=True)
    a_left, a_right = _expand(l_lo, l_hi)  # completed by a left record (owner is left)
    b_right, b_left = _expand(r_lo, r_hi)  # completed by a right record
    left = np.concatenate([a_left, b_left])
    right = np.concatenate([a_right, b_right])
    completion = np.concatenate([lt[a_left], rt[b_right]])
    if max_gap is not None:
        keep = np.abs(lt[left] - rt[right]) <= max_gap
        left, right, completion = left[keep], right[keep], completion[keep]
    # Both halves are already sorted by completion time: the stable sort is a linear merge.
    order = np.argsort(completion, kind="stable")
    return JoinPairs(left[order], right[order], completion[order])


# --- tables ---------------------------------------------------------------------------------


def _times_of(table: pa.Table, time_column: str, name: str) -> np.ndarray:
    if time_column not in table.column_names:
        reason = f"it has no column {time_column!r} (columns: {', '.join(table.column_names)})"
        raise JoinInputError(name, reason)
    column = table[time_column]
    if pa.types.is_null(column.type) and not len(column):
        return np.empty(0, dtype=np.float64)  # a CSV with a header and no rows
    if column.null_count:
        records = counted(column.null_count, "record")
        have = agreeing(column.null_count, "has", "have")
        them = agreeing(column.null_count, "it", "them")
        reason = f"{records} {have} no {time_column!r}: fill or drop {them} first"
        raise JoinInputError(name, reason)
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_timestamp(kind)):
        reason = f"column {time_column!r} is {kind}, not a number of seconds nor a timestamp"
        raise JoinInputError(name, reason)
    if pa.types.is_timestamp(kind) and kind.unit != "ns":
        try:  # one unit for both series: a timestamp's number is then nanoseconds
            column = column.cast(pa.timestamp("ns", kind.tz))
        except pa.ArrowInvalid:
            reason = f"its {time_column!r} has times outside the years 1677-2262 (nanoseconds)"
            raise JoinInputError(name, reason) from None
    return _numbers(column)


def _time_kind(kind: pa.DataType) -> str | None:
    """What a time column holds: plain numbers, instants (a timestamp with a time zone) or
    wall-clock times (one without); None for the null column of a CSV with no rows."""
    if pa.types.is_null(kind):
        return None
    if pa.types.is_timestamp(kind):
        return (
            "timestamps without a time zone" if kind.tz is None else "timestamps with a time zone"
        )
    return "numbers"


def _check_kinds(time_column: str, types: dict[str, pa.DataType]) -> str | None:
    """The one kind of the times of the series `types` (by name), or a `JoinInputError`:
    numbers and timestamps, or timestamps with and without a time zone, do not compare."""
    kinds = {name: _time_kind(kind) for name, kind in types.items()}
    known = {kind for kind in kinds.values() if kind is not None}
    if len(known) > 1:
        each = ", ".join(f"{types[name]} in the {name} series" for name in types)
        reason = (
            f"their {time_column!r} times are not of one kind ({each}): give both series "
            "numbers, or both timestamps, both with a time zone or both without"
        )
        both = "the two series"
        raise JoinInputError(both, reason)
    return known.pop() if known else None


def gap_in_units(max_gap: float | None, per_second: float) -> float | None:
    """`max_gap` seconds in a unit `per_second` of which make a second; a gap too large for a
    float in that unit is the largest float (no pair is that far apart), not infinity."""
    if max_gap is None:
        return None
    return min(max_gap * per_second, sys.float_info.max)


def _gap_in_units(kind: str | None, max_gap: float | None) -> float | None:
    """`max_gap` seconds in the times' unit: nanoseconds for timestamps (`_times_of`), the
    numbers' own unit otherwise."""
    return gap_in_units(max_gap, 1 if kind in (None, "numbers") else NS)


def _numbers(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column of numbers (a timestamp as its int64 count) without nulls, as numpy: the
    chunks' data buffers, viewed in place when there is one chunk."""
    kind = column.type
    if pa.types.is_floating(kind):
        dtype = np.dtype(f"f{kind.bit_width // 8}")
    else:
        signed = pa.types.is_timestamp(kind) or pa.types.is_signed_integer(kind)
        dtype = np.dtype(f"{'i' if signed else 'u'}{kind.bit_width // 8}")
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype)[c.offset : c.offset + len(c)]
        for c in chunks
        if len(c)
    ]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def _indices(rows: np.ndarray) -> pa.Array:
    """Row numbers as an Arrow int64 array over the same memory."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(rows), [None, pa.py_buffer(rows)])


def _prefixed(table: pa.Table, prefix: str) -> pa.Table:
    return table.rename_columns([f"{prefix}_{name}" for name in table.column_names])


def _pair_table(left: pa.Table, right: pa.Table, li: np.ndarray, ri: np.ndarray) -> pa.Table:
    lt = _prefixed(left.take(_indices(li)), "left")
    rt = _prefixed(right.take(_indices(ri)), "right")
    return pa.Table.from_arrays(lt.columns + rt.columns, names=lt.column_names + rt.column_names)


def _sorted_by_time(table: pa.Table, times: np.ndarray) -> tuple[pa.Table, np.ndarray]:
    if len(times) < 2 or (times[1:] >= times[:-1]).all():
        return table, times
    order = np.argsort(times, kind="stable")
    return table.take(_indices(order)), times[order]


def join_tables(
    left: pa.Table,
    right: pa.Table,
    time_column: str = "time",
    max_gap: float | None = None,
) -> JoinResult:
    """Join two tables on `time_column`; output columns `left_*` then `right_*`.

    The tables need not be sorted (they are sorted stably by time first). Pure function of
    its inputs: the same tables give the same rows in the same order, every time.
    """
    check_max_gap(max_gap)
    lt = _times_of(left, time_column, "the left series")
    rt = _times_of(right, time_column, "the right series")
    types = {"left": left[time_column].type, "right": right[time_column].type}
    kind = _check_kinds(time_column, types)
    left, lt = _sorted_by_time(left, lt)
    right, rt = _sorted_by_time(right, rt)
    pairs = join_indices(lt, rt, _gap_in_units(kind, max_gap))
    return JoinResult(
        table=_pair_table(left, right, pairs.left, pairs.right),
        pairs=len(pairs),
        left_rows=left.num_rows,
        right_rows=right.num_rows,
        left_unmatched=_unmatched(pairs.left, left.num_rows),
        right_unmatched=_unmatched(pairs.right, right.num_rows),
    )


def _unmatched(indices: np.ndarray, rows: int) -> int:
    seen = np.zeros(rows, dtype=bool)
    seen[indices] = True
    return int(rows - seen.sum())


# --- streaming ------------------------------------------------------------------------------


class StreamingJoin:
    """The same join, fed batch by batch in any interleaving of the two series.

    Each series must arrive in time order (a `SeriesOutOfOrder` error otherwise). A pair is
    emitted once it is final: its completion time is below the *horizon*, the earlier of
    the two series' latest times (a series that `end()`ed counts as infinitely late), since
    no later record of either series can change the pairs that complete before it.
    Concatenating every `push`/`end` result gives exactly `join_tables` of the whole series,
    row for row. Buffers keep only what future pairs can still need: records from the
    earlier of the two series' last groups below the horizon.

    Delivery: exactly-once per pair within one instance (a pair is emitted in the one call
    whose horizon passes its completion time); the instance is in-memory, so a caller that
    must survive a crash re-feeds both series from a checkpointed position together with
    the rows it already stored.
    """

    def __init__(self, time_column: str = "time", max_gap: float | None = None) -> None:
        self.time_column = time_column
        self.max_gap = check_max_gap(max_gap)
        self._tables: dict[Side, pa.Table | None] = {"left": None, "right": None}
        self._times: dict[Side, np.ndarray] = {}
        self._latest: dict[Side, float] = {"left": -np.inf, "right": -np.inf}
        self._ended: dict[Side, bool] = {"left": False, "right": False}
        self._emitted_below = -np.inf

    def push(self, side: Side, batch: pa.Table) -> pa.Table | None:
        """Add a batch of one series; return the rows that became final (None if none yet)."""
        times = _times_of(batch, self.time_column, f"the {side} series")
        self._kind({f"new {side}": batch[self.time_column].type})
        if len(times) == 0:
            return self._emit()
        first_back = np.flatnonzero(times[1:] < times[:-1])
        if times[0] < self._latest[side] or len(first_back):
            at = int(first_back[0]) + 1 if times[0] >= self._latest[side] else 0
            previous = self._latest[side] if at == 0 else float(times[at - 1])
            raise SeriesOutOfOrder(side, previous, float(times[at]))
        current = self._tables[side]
        self._tables[side] = batch if current is None else pa.concat_tables([current, batch])
        self._times[side] = np.concatenate([self._times.get(side, times[:0]), times])
        self._latest[side] = float(times[-1])
        return self._emit()

    def buffered(self, side: Side) -> int:
        """Rows of `side` kept for pairs not final yet."""
        table = self._tables[side]
        return 0 if table is None else table.num_rows

    def latest(self, side: Side) -> float | None:
        """The time of `side`'s latest record (None before its first)."""
        return None if self._latest[side] == -np.inf else self._latest[side]

    def end(self, side: Side) -> pa.Table | None:
        """Declare a series complete; return the rows that became final."""
        self._ended[side] = True
        return self._emit()

    def _kind(self, batch: dict[str, pa.DataType] | None = None) -> str | None:
        """The one kind of the buffered series' times and of a new `batch`'s (by name)."""
        types = {s: t[self.time_column].type for s, t in self._tables.items() if t is not None}
        return _check_kinds(self.time_column, {**types, **(batch or {})})

    def _horizon(self) -> float:
        return min(np.inf if self._ended[s] else self._latest[s] for s in ("left", "right"))

    def _emit(self) -> pa.Table | None:
        left, right = self._tables["left"], self._tables["right"]
        if left is None or right is None:
            return None
        horizon = self._horizon()
        gap = _gap_in_units(self._kind(), self.max_gap)
        pairs = join_indices(self._times["left"], self._times["right"], gap)
        band = (pairs.completion >= self._emitted_below) & (pairs.completion < horizon)
        rows = _pair_table(left, right, pairs.left[band], pairs.right[band])
        self._emitted_below = max(self._emitted_below, horizon)
        self._trim(horizon)
        return rows if rows.num_rows else None

    def save(self, folder: Path) -> None:
        """Persist the joiner (buffers as Arrow IPC, the rest as JSON) into `folder`."""
        from pyarrow import feather

        folder.mkdir(parents=True, exist_ok=True)
        for side, table in self._tables.items():
            if table is not None:
                feather.write_feather(table, folder / f"{side}.arrow")
        state = {
            "version": STATE_VERSION,
            "time_column": self.time_column,
            "max_gap": self.max_gap,
            "latest": self._latest,
            "ended": self._ended,
            "emitted_below": self._emitted_below,
        }
        (folder / "join.json").write_text(json.dumps(state, sort_keys=True))

    @classmethod
    def load(cls, folder: Path) -> StreamingJoin:
        """A joiner as `save` left it."""
        from pyarrow import feather

        state = json.loads((folder / "join.json").read_text())
        if state.get("version") != STATE_VERSION:
            reason = f"join state version {state.get('version')!r} is not {STATE_VERSION}"
            raise JoinInputError(str(folder), reason)
        joiner = cls(state["time_column"], state["max_gap"])
        joiner._latest, joiner._ended = state["latest"], state["ended"]
        joiner._emitted_below = state["emitted_below"]
        for side in ("left", "right"):
            path = folder / f"{side}.arrow"
            if path.exists():
                table = feather.read_table(path)
                joiner._tables[side] = table
                joiner._times[side] = _times_of(table, joiner.time_column, f"the {side} series")
        return joiner

    def _trim(self, horizon: float) -> None:
        keep_from = np.inf
        for side in ("left", "right"):
            below = self._times[side][self._times[side] < horizon]
            keep_from = min(keep_from, below[-1] if len(below) else -np.inf)
        for side in ("left", "right"):
            first = int(np.searchsorted(self._times[side], keep_from, side="left"))
            if first:
                self._times[side] = self._times[side][first:]
                self._tables[side] = self._tables[side].slice(first)


# --- files ----------------------------------------------------------------------------------


def read_series(path: Path) -> pa.Table:
    """A Parquet or CSV file (by extension; CSV with a header row) as an Arrow table; a file
    that is missing, empty, not of its kind or repeats a column name is a `JoinInputError`."""
    path = Path(path)
    if not path.exists():
        reason = "no such file"
        raise JoinInputError(str(path), reason)
    if path.is_dir():
        reason = "it is a directory: give a .parquet or .csv file"
        raise JoinInputError(str(path), reason)
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".pq", ".csv", ".txt"):
        reason = f"unknown file type {suffix!r}: give a .parquet or .csv file"
        raise JoinInputError(str(path), reason)
    if path.stat().st_size == 0:
        reason = "the file is empty (0 bytes): a CSV needs a header row, Parquet a footer"
        raise JoinInputError(str(path), reason)
    kind = "Parquet" if suffix in (".parquet", ".pq") else "CSV"
    try:
        return _read_parquet(path) if kind == "Parquet" else _read_csv(path)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        reason = f"not a readable {kind} file ({_first_line(exc)})"
        raise JoinInputError(str(path), reason) from None


def _check_names(path: Path, names: list[str]) -> None:
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        reason = f"it repeats the column name(s) {', '.join(map(repr, repeated))}: rename them"
        raise JoinInputError(str(path), reason)


def _read_parquet(path: Path) -> pa.Table:
    """The whole file (one footer read; `pq.read_table` would go through pyarrow.dataset,
    which imports pandas)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as parquet:
        _check_names(path, parquet.schema_arrow.names)
        return parquet.read()


def _read_csv(path: Path) -> pa.Table:
    import pyarrow.csv as pacsv

    table = pacsv.read_csv(path)
    _check_names(path, table.column_names)
    return table


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def output_format(output: Path) -> OutputFormat:
    """The format the output is written in, by its extension (`OUTPUT_FORMATS`); any other
    extension is refused (`JoinOutputError`), so a file is never named for another format."""
    suffix = Path(output).suffix.lower()
    if suffix not in OUTPUT_FORMATS:
        what = f"{suffix!r} is no format the join writes" if suffix else "it has no extension"
        reason = f"{what}: end the name in .parquet (Parquet) or .csv (CSV)"
        raise JoinOutputError(str(output), reason)
    return OUTPUT_FORMATS[suffix]


def check_output(output: Path, inputs: Sequence[Path]) -> OutputFormat:
    """The output's format (`output_format`), after refusing an output that is a directory
    or one of the inputs (the same file after resolving the paths, symbolic links and hard
    links): writing it would destroy an input; or one that cannot be written
    (`check_writable`: a file in the way of its directory, a read-only or full filesystem)."""
    output = Path(output)
    if output.is_dir():
        reason = "it is a directory: give a file name, such as DIR/pairs.parquet"
        raise JoinOutputError(str(output), reason)
    kind = output_format(output)
    check_writable(output, "output file", file=True)
    for source in inputs:
        same = output.resolve() == Path(source).resolve()
        if not same and output.exists():
            same = os.path.samefile(output, source)
        if same:
            reason = f"it is the input {source}: choose another output file"
            raise JoinOutputError(str(output), reason)
    return kind


def write_pairs(table: pa.Table, path: Path, kind: OutputFormat = "parquet") -> None:
    """The joined rows as CSV with a header row, as `read_series` reads them back (ISO 8601
    timestamps, an empty cell for a null), or as Parquet (snappy), dictionary-encoding only
    text and binary columns: sensor names repeat, while times and readings rarely do, and
    trying a dictionary on them first costs about as much as writing them."""
    if kind == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, path)
        return
    import pyarrow.parquet as pq

    texts = [
        f.name
        for f in table.schema
        if pa.types.is_string(f.type)
        or pa.types.is_large_string(f.type)
        or pa.types.is_binary(f.type)
        or pa.types.is_large_binary(f.type)
        or pa.types.is_dictionary(f.type)
    ]
    pq.write_table(table, path, use_dictionary=texts or False)


def check_csv_columns(table: pa.Table, output: Path) -> None:
    """Refuse (`JoinOutputError`) columns that a CSV cell cannot hold: lists, structs, maps."""
    nested = [f"{f.name} ({f.type})" for f in table.schema if pa.types.is_nested(f.type)]
    if nested:
        hold = agreeing(len(nested), "holds", "hold")
        reason = f"{', '.join(nested)} {hold} nested values, which CSV cannot: write .parquet"
        raise JoinOutputError(str(output), reason)


def join_files(
    left: Path,
    right: Path,
    output: Path,
    time_column: str = "time",
    max_gap: float | None = None,
) -> JoinResult:
    """Join two files into one Parquet or CSV file, by the output's extension (written to a
    temporary name, then renamed).

    The output may be neither a directory, nor one of the inputs, nor of another extension;
    the inputs are only read. Delivery: exactly-once for the output file: a crash leaves
    either no file or the whole one, and re-running replaces it with identical rows.
    """
    check_max_gap(max_gap)
    kind = check_output(output, (left, right))
    result = join_tables(read_series(left), read_series(right), time_column, max_gap)
    if kind == "csv":
        check_csv_columns(result.table, output)
    try:
        with durable.atomic_path(output) as staging:
            write_pairs(result.table, staging, kind)
    except OSError as exc:
        refused = refusal(output, exc, RERUN, "output file")
        if refused is not None:
            raise refused from None
        reason = f"it cannot be written ({exc.strerror or exc})"
        raise JoinOutputError(str(output), reason) from None
    return result
