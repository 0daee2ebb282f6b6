"""`sluice slices create|list`: record and list slices of a stream's history (stream-cut pairs).

Slices are also recorded continuously by `sluice run bookmark` (`pipeline/jobs/bookmark.py`).
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from pipeline.cli.options import slices_stream_option

if TYPE_CHECKING:
    from pipeline.jobs.slices import SliceExtent, SliceRecord


def register(subparsers: argparse._SubParsersAction) -> None:

    p = subparsers.add_parser("slices", help="bookmarked pieces of a stream's history")
    sub = p.add_subparsers(dest="slices_command", required=True, metavar="ACTION")
    c = sub.add_parser(
        "create",
        help="record the slice of STREAM between two event times",
        description="Record a slice holding every event whose time bounds meet [--from, --to) "
        "(times without a zone are UTC). The cuts come from the time bounds writers attach.",
    )
    c.add_argument("stream", metavar="SCOPE/STREAM", help="the stream to slice")
    c.add_argument(
        "--from",
        dest="start",
        required=True,
        metavar="TIME",
        help="the window's start (ISO 8601, e.g. 2026-11-01T00:00Z)",
    )
    c.add_argument(
        "--to", dest="end", required=True, metavar="TIME", help="the window's end (ISO 8601)"
    )
    c.add_argument("--sensor", help="only this sensor (its routing key, or see --sensor-by)")
    c.add_argument(
        "--sensor-by",
        default="routing_key",
        help="what names a sensor: routing_key, or columns such as RemoteAddr,Interface",
    )
    c.add_argument(
        "--allow-empty",
        action="store_true",
        help="record the slice even when no event lies in the window (refused by default)",
    )
    slices_stream_option(c)
    c.set_defaults(func=_run_slices_create)
    ls = sub.add_parser("list", help="the slices of STREAM")
    ls.add_argument("stream", metavar="SCOPE/STREAM", help="the sliced stream")
    ls.add_argument("--json", action="store_true", help="one JSON object per slice")
    slices_stream_option(ls)
    ls.set_defaults(func=_run_slices_list)


def _run_slices_create(args: argparse.Namespace) -> int:
    from pipeline.jobs.slices import (
        EmptySlice,
        SliceExtent,
        check_window,
        parse_time_ns,
        record_slices,
        recorded_as,
        time_window_slice,
    )
    from pipeline.streams import open_store

    start, end = parse_time_ns(args.start), parse_time_ns(args.end)
    check_window(start, end, given=(args.start, args.end))
    if args.sensor is not None and args.sensor_by != "routing_key":
        _check_sensor_by(args.stream, args.sensor_by)
    with open_store(args.store, must_exist=True) as store:
        record = time_window_slice(
            store, args.stream, start, end, sensor=args.sensor, sensor_by=args.sensor_by
        )
        extent = SliceExtent.of(store, record)
        if extent.events == 0 and not args.allow_empty:
            raise EmptySlice(record)
        written = record_slices(store, [record], args.slices_stream)
        if not written:  # the one recorded, by its id or by what it reads (`content_key`)
            record = recorded_as(store, record, args.slices_stream)
    status = "created" if written else "exists"
    print(json.dumps({"status": status, **_row(record, extent)}))
    return 0


def _check_sensor_by(stream: str, sensor_by: str) -> None:
    """Refuse sensor columns that the rows of the stream's schema lack, when sluice.toml
    names that schema; otherwise only the replay knows it (`sluice replay --schema`), and
    checks it there, before Spark starts (`pipeline.jobs.replay.check_sensor_by`)."""
    from pipeline.cli.replay import known_schema
    from pipeline.schemas import flatten_plan
    from pipeline.schemas.sensors import check_sensor_columns

    schema = known_schema(stream)
    if schema is not None:
        columns = flatten_plan(schema).arrow_schema.names
        check_sensor_columns(sensor_by, columns, f"the rows of {schema}")


def _row(record: SliceRecord, extent: SliceExtent) -> dict:
    row = {**record.row(), "events": extent.events, "bytes": extent.bytes}
    return row if extent.truncated is None else {**row, "truncated": extent.truncated}


def _run_slices_list(args: argparse.Namespace) -> int:
    from pipeline.cli.table import render
    from pipeline.jobs.slices import SliceExtent, list_slices
    from pipeline.streams import StreamNotFound, open_store, parse_stream

    with open_store(args.store, must_exist=True) as store:
        if not store.stream_exists(args.stream):  # as `slices create` refuses it
            raise StreamNotFound(*parse_stream(args.stream))
        records = list_slices(store, args.stream, args.slices_stream)
        rows = [_row(r, SliceExtent.of(store, r)) for r in records]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    columns = ["slice_id", "sensor", "events", "start_time", "span", "reason", "created_by"]
    for row in rows:  # its events are gone, in part at least: no count would be true
        row["events"] = "truncated" if "truncated" in row else row["events"]
    print(render(columns, [[row[c] for c in columns] for row in rows]))
    return 0
