"""`sluice sql`, `sluice plot rates` and `sluice analytics refresh`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.analytics.catalog import (
    AnalyticsError,
    AnalyticsPaths,
    ExportSource,
    discover_exports,
    parse_export_option,
    query,
    refresh,
    snapshot_slices,
)
from pipeline.jobs.slices import DEFAULT_SLICES_STREAM


def _add_source_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="SCOPE/STREAM=DIR",
        help="an export directory to include (repeatable); the exports of every "
        "[streams.NAME] in sluice.toml are included anyway",
    )
    p.add_argument("--slices-stream", default=DEFAULT_SLICES_STREAM, metavar="SCOPE/STREAM")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sql",
        help="run SQL on the analytics database (DuckDB views over exports, rates, "
        "quarantine, slices, replays, lineage)",
    )
    p.add_argument("sql", help='e.g. "SELECT Interface, max(rx_mbps) FROM rates GROUP BY 1"')
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument("--max-rows", type=int, default=100, help="rows to print (0: all)")
    _add_source_options(p)
    p.set_defaults(func=cmd_sql)

    p = subparsers.add_parser("plot", help="charts from the analytics database")
    sub = p.add_subparsers(dest="plot_command", required=True, metavar="CHART")
    r = sub.add_parser("rates", help="PNG scatter (XY) plot of rx/tx Mbit/s per sample over time")
    r.add_argument("stream", metavar="NAME|SCOPE/STREAM", help="an export name or its stream")
    r.add_argument("--from", dest="start", metavar="TIME", help="ISO 8601, e.g. 2026-11-01T00:00Z")
    r.add_argument("--to", dest="end", metavar="TIME")
    r.add_argument("--output", "-o", type=Path, help="PNG path (default under $SLUICE_HOME/plots)")
    r.add_argument("--max-points", type=int, default=200_000)
    _add_source_options(r)
    r.set_defaults(func=cmd_plot_rates)

    p = subparsers.add_parser("analytics", help="the DuckDB analytics database")
    sub = p.add_subparsers(dest="analytics_command", required=True, metavar="ACTION")
    r = sub.add_parser("refresh", help="rebuild the views; print the database path and views")
    _add_source_options(r)
    r.set_defaults(func=cmd_refresh)


def _refresh(args: argparse.Namespace) -> tuple[AnalyticsPaths, list[ExportSource], list[str]]:
    from pipeline.jobs.slices import list_slices
    from pipeline.settings import load_settings
    from pipeline.streams import open_store

    settings = load_settings()
    paths = AnalyticsPaths.from_settings(settings)
    extra = [parse_export_option(text) for text in args.export]
    exports = discover_exports(settings, extra)
    with open_store(args.store) as store:
        snapshot_slices(paths, list_slices(store, None, args.slices_stream))
    return paths, exports, refresh(paths, exports)


def cmd_refresh(args: argparse.Namespace) -> int:
    paths, exports, views = _refresh(args)
    print(f"database: {paths.database}")
    for source in exports:
        print(f"export:   {source.name} <- {source.root}")
    print(f"views:    {', '.join(views)}")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    from pipeline.cli.table import render

    paths, _, _ = _refresh(args)
    columns, rows = query(paths, args.sql)
    if args.json:
        for row in rows:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=str))
    elif columns:
        print(render(columns, rows, args.max_rows))
    return 0


def cmd_plot_rates(args: argparse.Namespace) -> int:
    from pipeline.analytics.plot import plot_rates
    from pipeline.jobs.slices import parse_time_ns

    paths, exports, _ = _refresh(args)
    source = next((s for s in exports if s.matches(args.stream)), None)
    if source is None:
        known = ", ".join(s.name for s in exports) or "none"
        reason = (
            f"no export of it is known (known: {known}); pass --export {args.stream}=DIR "
            "or export it with `sluice run export`"
        )
        msg = f"cannot plot {args.stream}"
        raise AnalyticsError(msg, reason)
    start = parse_time_ns(args.start) if args.start else None
    end = parse_time_ns(args.end) if args.end else None
    result = plot_rates(
        paths, source, start_ns=start, end_ns=end, output=args.output, max_points=args.max_points
    )
    print(f"wrote {result.path} ({result.points:,} points from {result.samples:,} samples)")
    return 0
