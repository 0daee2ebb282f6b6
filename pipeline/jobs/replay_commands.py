"""`sluice join`, `sluice slices …` and `sluice replay …`: working with a stream's history."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_join(subparsers)
    _register_slices(subparsers)
    _register_replay(subparsers)


def _register_join(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "join",
        help="time-series join of two files: each record with its nearest predecessor and "
        "successor in the other series",
        description="Join LEFT and RIGHT (Parquet or CSV files with a time column in seconds): "
        "each record of either series is paired with the latest record at or before its time "
        "and the earliest at or after it in the other series; each pair once, in an order "
        "that does not depend on how the files were written. See pipeline/timejoin.py.",
    )
    p.add_argument("left", type=Path, help="left series (.parquet or .csv)")
    p.add_argument("right", type=Path, help="right series (.parquet or .csv)")
    p.add_argument("--output", "-o", type=Path, required=True, help="output Parquet file")
    p.add_argument("--time-column", default="time", help="time column of both files (seconds)")
    p.add_argument(
        "--max-gap",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drop pairs whose times are more than this apart",
    )
    p.set_defaults(func=_run_join)


def _run_join(args: argparse.Namespace) -> int:
    from pipeline.timejoin import JoinInputError, join_files

    if args.max_gap is not None and args.max_gap < 0:
        reason = f"--max-gap must be zero or more seconds, not {args.max_gap}"
        raise JoinInputError(str(args.left), reason)
    result = join_files(args.left, args.right, args.output, args.time_column, args.max_gap)
    print(json.dumps({"output": str(args.output), **result.as_dict()}))
    return 0


# --- slices ---------------------------------------------------------------------------------


def _register_slices(subparsers: argparse._SubParsersAction) -> None:
    from pipeline.jobs.slices import DEFAULT_SLICES_STREAM

    p = subparsers.add_parser("slices", help="bookmarked pieces of a stream's history")
    sub = p.add_subparsers(dest="slices_command", required=True, metavar="ACTION")
    c = sub.add_parser(
        "create",
        help="record the slice of STREAM between two event times",
        description="Record a slice holding every event whose time bounds meet [--from, --to) "
        "(times without a zone are UTC). The cuts come from the time bounds writers attach.",
    )
    c.add_argument("stream", metavar="SCOPE/STREAM")
    c.add_argument("--from", dest="start", required=True, metavar="TIME", help="2026-11-01T00:00Z")
    c.add_argument("--to", dest="end", required=True, metavar="TIME")
    c.add_argument("--sensor", help="only this sensor (its routing key, or see --sensor-by)")
    c.add_argument(
        "--sensor-by",
        default="routing_key",
        help="what names a sensor: routing_key, or columns such as RemoteAddr,Interface",
    )
    c.add_argument("--slices-stream", default=DEFAULT_SLICES_STREAM, metavar="SCOPE/STREAM")
    c.set_defaults(func=_run_slices_create)
    ls = sub.add_parser("list", help="the slices of STREAM")
    ls.add_argument("stream", metavar="SCOPE/STREAM")
    ls.add_argument("--json", action="store_true", help="one JSON object per slice")
    ls.add_argument("--slices-stream", default=DEFAULT_SLICES_STREAM, metavar="SCOPE/STREAM")
    ls.set_defaults(func=_run_slices_list)


def _run_slices_create(args: argparse.Namespace) -> int:
    from pipeline.jobs.slices import parse_time_ns, record_slices, time_window_slice
    from pipeline.streams import open_store

    start, end = parse_time_ns(args.start), parse_time_ns(args.end)
    with open_store(args.store) as store:
        record = time_window_slice(
            store, args.stream, start, end, sensor=args.sensor, sensor_by=args.sensor_by
        )
        written = record_slices(store, [record], args.slices_stream)
    status = "created" if written else "exists"
    print(json.dumps({"status": status, **record.row()}))
    return 0


def _run_slices_list(args: argparse.Namespace) -> int:
    from pipeline.analytics.table import render
    from pipeline.jobs.slices import list_slices
    from pipeline.streams import open_store

    with open_store(args.store) as store:
        records = list_slices(store, args.stream, args.slices_stream)
    if args.json:
        for record in records:
            print(json.dumps(record.row()))
        return 0
    columns = ["slice_id", "sensor", "start_time", "end_time", "reason", "created_by"]
    rows = [[r.row()[c] for c in columns] for r in records]
    print(render(columns, rows))
    return 0


# --- replay ---------------------------------------------------------------------------------


def _register_replay(subparsers: argparse._SubParsersAction) -> None:
    from pipeline.jobs.slices import DEFAULT_SLICES_STREAM

    p = subparsers.add_parser(
        "replay",
        help="run a model over exactly one slice (or compare two models on it)",
        description="sluice replay SLICE_ID --model M  |  "
        "sluice replay compare SLICE_ID --model A --model B. "
        "A model is module:function, optionally followed by ,key=value parameters "
        "(values are JSON, else text): pipeline.models.nic:throughput,burst_mbps=20",
    )
    p.add_argument("words", nargs="+", metavar="SLICE_ID | compare SLICE_ID")
    p.add_argument("--model", action="append", required=True, metavar="MODULE:FUNCTION[,K=V]")
    p.add_argument("--output", type=Path, help="output directory (one model only)")
    p.add_argument("--schema", help="Avro schema of the stream (default: from sluice.toml)")
    p.add_argument("--slices-stream", default=DEFAULT_SLICES_STREAM, metavar="SCOPE/STREAM")
    p.set_defaults(func=_run_replay)


def parse_model_option(text: str) -> tuple[str, dict]:
    """`module:function,key=value,...` -> (spec, params)."""
    from pipeline.jobs.replay import ModelError

    spec, *pairs = text.split(",")
    params = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ModelError(spec, f"parameter {pair!r} is not key=value")
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
    return spec.strip(), params


def _schema_for(stream: str, given: str | None) -> str:
    from pipeline.jobs.replay import UnknownSchema
    from pipeline.settings import load_settings

    if given:
        return given
    for family in load_settings().streams:
        if stream in (family.stream, family.mirror_stream):
            return family.schema
    raise UnknownSchema(stream)


def _run_replay(args: argparse.Namespace) -> int:
    from pipeline.config import sluice_home
    from pipeline.jobs.replay import ModelError, ReplayError, compare, load_model, replay
    from pipeline.jobs.slices import find_slice
    from pipeline.schemas import flatten_plan
    from pipeline.spark.session import spark_session
    from pipeline.streams import open_store

    comparing = args.words[0] == "compare"
    if len(args.words) != (2 if comparing else 1):
        msg = "usage: sluice replay SLICE_ID | sluice replay compare SLICE_ID (see --help)"
        raise ReplayError(msg)
    slice_id = args.words[-1]
    models = [load_model(*parse_model_option(text)) for text in args.model]
    if len(models) != (2 if comparing else 1):
        wanted = "two --model options to compare" if comparing else "one --model"
        raise ModelError(args.model[0], f"give {wanted}")
    with open_store(args.store) as store:
        record = find_slice(store, slice_id, args.slices_stream)
        plan = flatten_plan(_schema_for(record.stream, args.schema))
        spark = spark_session()
        results = [
            replay(
                spark,
                store,
                slice_id,
                model,
                plan=plan,
                home=sluice_home(),
                output_dir=args.output if not comparing else None,
                slices_stream=args.slices_stream,
            )
            for model in models
        ]
    if comparing:
        print(json.dumps(compare(*results).as_dict(), indent=2, default=str))
        return 0
    lineage = results[0].lineage
    print(
        json.dumps(
            {
                "run_id": lineage.run_id,
                "results": lineage.results_path,
                "metrics": lineage.metrics_path,
                "input_events": lineage.input_events,
                "input_rows": lineage.input_rows,
                "output_rows": lineage.output_rows,
                "model_version": lineage.model_version,
            }
        )
    )
    return 0
