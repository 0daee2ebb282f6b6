"""Reading CSV and Parquet files as rows, and checking them whole before any is sent.

`validate` reads a file to the end and raises `BadFile` with the reason it is unusable, so a
malformed file goes to the failed folder before a row of it reaches the buffer; `rows` then
yields `(row, time_ns)` from a given row number on (the files driver resumes a file after a
crash by skipping the rows it buffered). CSV fields become numbers where they parse, as the
Pravega Sensor Collector's `CsvFileEventGenerator` does; Parquet values become JSON (ISO-8601
times, decimals as text, bytes as base64). CSV is read by the standard library's `csv` module
in strict mode, Parquet by pyarrow.
"""

from __future__ import annotations

import base64
import codecs
import csv
import datetime as dt
import decimal
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectors.batch import encode_json
from pipeline.streams import MAX_EVENT_SIZE

#: What a CSV field must look like to become a number: ASCII digits, an optional sign,
#: fraction and exponent, spaces around (`int`/`float` alone also take `1_000` and `١٢`).
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)
_DECIMAL = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?\s*", re.ASCII)

TIME_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "iso": 0}


class BadFile(Exception):
    """Why a file cannot be ingested (its message is written beside the moved file)."""


@dataclass(frozen=True, slots=True)
class TableFormat:
    kind: str  # "csv" | "parquet"
    time_column: str | None
    time_unit: str
    delimiter: str = ","


def validate(path: Path, fmt: TableFormat) -> None:
    """Read the whole file; raise `BadFile` with the reason if any part is unusable (a row
    too large for one event included)."""
    for index, (row, _) in enumerate(rows(path, fmt, 0)):
        size = len(encode_json([row]))
        if size > MAX_EVENT_SIZE:
            msg = f"row {index + 1} is {size} bytes as JSON, over the event limit {MAX_EVENT_SIZE}"
            raise BadFile(msg)


def rows(path: Path, fmt: TableFormat, start: int) -> Iterator[tuple[dict, int | None]]:
    """Rows from row number `start` (0-based), each with its event time if configured."""
    source = _csv_rows(path, fmt) if fmt.kind == "csv" else _parquet_rows(path, fmt)
    for index, row in enumerate(source):
        time_ns = _row_time(row, fmt, index) if fmt.time_column else None
        if index >= start:
            yield row, time_ns


def _csv_rows(path: Path, fmt: TableFormat) -> Iterator[dict]:
    # utf-8-sig: a byte order mark (Excel's "CSV UTF-8") is not part of the first column's name
    with path.open(newline="", encoding="utf-8-sig", errors="strict") as fh:
        reader = csv.reader(_lines(fh), delimiter=fmt.delimiter, strict=True)
        try:
            header = _header(next(reader, []), fmt)
            for fields in reader:
                if not fields:
                    continue  # blank line
                if any("\0" in field for field in fields):
                    msg = f"line {reader.line_num}: a NUL character (a damaged or binary file)"
                    raise BadFile(msg)
                if len(fields) != len(header):
                    msg = (
                        f"line {reader.line_num}: {len(fields)} fields where the header "
                        f"has {len(header)}"
                    )
                    raise BadFile(msg)
                yield {name: _convert(text) for name, text in zip(header, fields, strict=True)}
        except csv.Error as exc:
            msg = f"line {reader.line_num}: {exc}"
            raise BadFile(msg) from None
        except UnicodeDecodeError as exc:
            raise BadFile(_not_utf8(path, exc.reason)) from None


def _lines(fh: Any) -> Iterator[str]:
    """The file's lines, refusing one that could not fit in an event before it is all in
    memory (a file without line ends would otherwise be read whole)."""
    for number, line in enumerate(iter(lambda: fh.readline(MAX_EVENT_SIZE), ""), 1):
        if len(line) == MAX_EVENT_SIZE and not line.endswith(("\n", "\r")):
            msg = f"line {number} is longer than {MAX_EVENT_SIZE} characters (the event limit)"
            raise BadFile(msg)
        yield line


def _not_utf8(path: Path, reason: str) -> str:
    """Where the first byte that is not UTF-8 is (the decoder's own offset is within a
    chunk)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = line = 0
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 16), b""):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                at = offset + exc.start
                line += chunk[: exc.start].count(b"\n")
                return f"not UTF-8 text ({reason} at byte {at}, line {line + 1})"
            offset += len(chunk)
            line += chunk.count(b"\n")
    return f"not UTF-8 text ({reason})"


def _header(fields: list[str], fmt: TableFormat) -> list[str]:
    if not fields:
        return []  # an empty file: no rows
    names = [f.strip() for f in fields]
    if any(not n for n in names):
        msg = "line 1: the header has an empty column name"
        raise BadFile(msg)
    if len(set(names)) != len(names):
        msg = "line 1: the header repeats a column name"
        raise BadFile(msg)
    if fmt.time_column and fmt.time_column not in names:
        msg = f"line 1: no time column {fmt.time_column!r} in the header"
        raise BadFile(msg)
    return names


def _convert(text: str) -> Any:
    if _INTEGER.fullmatch(text):
        try:
            return int(text)
        except ValueError:  # over Python's 4300 digits
            return text
    if not _DECIMAL.fullmatch(text):
        return text
    number = float(text)
    return number if math.isfinite(number) else text


def _parquet_rows(path: Path, fmt: TableFormat) -> Iterator[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
        if fmt.time_column and fmt.time_column not in parquet.schema_arrow.names:
            msg = f"no time column {fmt.time_column!r} in the Parquet schema"
            raise BadFile(msg)
        for batch in parquet.iter_batches(batch_size=4096):
            for row in batch.to_pylist():
                yield {key: _jsonable(value) for key, value in row.items()}
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        msg = f"not a readable Parquet file: {exc}"
        raise BadFile(msg) from None


def _jsonable(value: Any) -> Any:
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if value is None or isinstance(value, bool | int | str):
        return value
    for types, convert in _CONVERTERS:
        if isinstance(value, types):
            return convert(value)
    return str(value)


_CONVERTERS: tuple[tuple[type | tuple[type, ...], Callable[[Any], Any]], ...] = (
    (float, lambda v: v if math.isfinite(v) else repr(v)),
    ((dt.datetime, dt.date, dt.time), lambda v: v.isoformat()),
    (decimal.Decimal, str),
    (bytes, lambda v: base64.b64encode(v).decode()),
    (dt.timedelta, lambda v: v // dt.timedelta(microseconds=1) * 1000),
)


def _row_time(row: dict, fmt: TableFormat, index: int) -> int:
    value = row.get(fmt.time_column)
    try:
        if fmt.time_unit == "iso":
            stamp = dt.datetime.fromisoformat(str(value))
            if stamp.tzinfo is None:
                stamp = stamp.replace(tzinfo=dt.UTC)
            return int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(value)
        return int(value * TIME_UNITS[fmt.time_unit])
    except (ValueError, TypeError, OverflowError):
        msg = f"row {index + 1}: {fmt.time_column} = {value!r} is not a time in {fmt.time_unit}"
        raise BadFile(msg) from None
