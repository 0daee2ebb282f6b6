"""Samples batched into events, in the Pravega Sensor Collector's JSON layout: parallel arrays
(`TimestampNanos` first, one per measured quantity), then the constant fields and
`LastTimestampFormatted`, with no spaces:

    {"TimestampNanos":[...],"RxBytes":[...],"TxBytes":[...],"RemoteAddr":"host",
     "Interface":"eth0","LastTimestampFormatted":"2020-12-30T21:29:17.809Z"}

An event over the store's 8 MiB limit is split in halves until each part fits, so a too-large
`samples_per_event` costs more events, never a rejected batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from collectors.buffer.schema import PendingEvent
from pipeline.streams import MAX_EVENT_SIZE

TIME_COLUMN = "TimestampNanos"
_encoder = msgspec.json.Encoder()  # compact, UTF-8, dict order kept; faster than json


def format_timestamp(ns: int) -> str:
    """`2020-12-30T21:29:17.809Z`: UTC, milliseconds, as the Pravega Sensor Collector formats it."""
    seconds, rest = divmod(ns, 1_000_000_000)
    stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{rest // 1_000_000:03d}Z"


def camel_case(name: str) -> str:
    """`rx_bytes` -> `RxBytes` (the Pravega Sensor Collector's field names)."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def encode_json(value: Any) -> bytes:
    """Compact JSON (no spaces, key order kept), as the Pravega Sensor Collector writes it."""
    return _encoder.encode(value)


class ColumnBatch:
    """Parallel arrays of samples, `TimestampNanos` first, with constant fields after them."""

    def __init__(self, columns: Iterable[str], constants: Mapping[str, Any]) -> None:
        self.columns: dict[str, list] = {TIME_COLUMN: []}
        for name in columns:
            self.columns[name] = []
        self.constants = dict(constants)

    def __len__(self) -> int:
        return len(self.columns[TIME_COLUMN])

    def add(self, timestamp_ns: int, values: Iterable[Any]) -> None:
        """Append one sample: its time and one value per column, in column order."""
        arrays = iter(self.columns.values())
        next(arrays).append(timestamp_ns)
        for array, value in zip(arrays, values, strict=True):
            array.append(value)

    def extend(self, columns: Mapping[str, list]) -> None:
        """Append many samples given as whole columns (all of the same length)."""
        for name, array in self.columns.items():
            array.extend(columns[name])

    def detach(self, count: int | None = None) -> ColumnBatch:
        """Hand over the first `count` samples (default all) as a new batch."""
        taken = ColumnBatch((), self.constants)
        if count is None or count >= len(self):
            taken.columns = self.columns
            self.columns = {name: [] for name in self.columns}
        else:
            taken.columns = {name: array[:count] for name, array in self.columns.items()}
            self.columns = {name: array[count:] for name, array in self.columns.items()}
        return taken

    def take_events(self, routing_key: str | None) -> list[PendingEvent]:
        """Serialize the batch (split if over the size limit) and empty it."""
        if not len(self):
            return []
        events = columns_to_events(self.columns, self.constants, routing_key)
        self.columns = {name: [] for name in self.columns}
        return events


def columns_to_events(
    columns: Mapping[str, list], constants: Mapping[str, Any], routing_key: str | None
) -> list[PendingEvent]:
    times = columns[TIME_COLUMN]
    document = {**columns, **constants, "LastTimestampFormatted": format_timestamp(times[-1])}
    payload = encode_json(document)
    if len(payload) <= MAX_EVENT_SIZE or len(times) == 1:
        return [PendingEvent(payload, routing_key, min(times), max(times), len(times))]
    half = len(times) // 2
    first = {name: array[:half] for name, array in columns.items()}
    second = {name: array[half:] for name, array in columns.items()}
    return columns_to_events(first, constants, routing_key) + columns_to_events(
        second, constants, routing_key
    )
