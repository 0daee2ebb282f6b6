"""`sluice sql`, `sluice plot rates` and `sluice analytics refresh`.

`sql` and `plot` only read the database, in its sandbox (`pipeline/analytics/sandbox.py`);
`analytics refresh` is the one command that rebuilds its views."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.cli.options import whole_number
from pipeline.wording import counted

if TYPE_CHECKING:
    import duckdb

    from pipeline.analytics.sources import AnalyticsPaths


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sql",
        help="run SQL on the analytics database (DuckDB views over exports, rates, "
        "quarantine, slices, replays, lineage); read-only",
        description="Read-only SQL on the analytics database: SELECT (WITH, FROM, DESCRIBE, "
        "SUMMARIZE, SHOW), EXPLAIN, PRAGMA, CALL; with several statements, the last one's rows. "
        "It reads only Sluice's data directories (SELECT * FROM sources); it never rebuilds the "
        "views (sluice analytics refresh does).",
    )
    p.add_argument("sql", help='e.g. "SELECT Interface, max(rx_mbps) FROM rates GROUP BY 1"')
    p.add_argument("--json", action="store_true", help="one JSON object per row")
    p.add_argument(
        "--max-rows",
        type=whole_number(0, "rows to print: 0 (all) or more"),
        default=100,
        help="rows of the table to print (0: all; --json prints every row)",
    )
    p.set_defaults(func=cmd_sql)

    p = subparsers.add_parser("plot", help="charts from the analytics database")
    sub = p.add_subparsers(dest="plot_command", required=True, metavar="CHART")
    r = sub.add_parser("rates", help="PNG scatter (XY) plot of rx/tx Mbit/s per sample over time")
    r.add_argument("stream", metavar="NAME|SCOPE/STREAM", help="an export name or its stream")
    r.add_argument("--from", dest="start", metavar="TIME", help="ISO 8601, e.g. 2026-11-01T00:00Z")
    r.add_argument("--to", dest="end", metavar="TIME", help="the chart's end (ISO 8601)")
    r.add_argument("--output", "-o", type=Path, help="PNG path (default under $SLUICE_HOME/plots)")
    r.add_argument(
        "--max-points",
        type=whole_number(2, "the most points to draw: 2 or more"),
        default=200_000,
        help="draw at most this many points (2 or more): more samples are reduced to each "
        "NIC's maximum rate per time bucket, the buckets shared among the NICs (one at least)",
    )
    r.set_defaults(func=cmd_plot_rates)

    p = subparsers.add_parser("analytics", help="the DuckDB analytics database")
    sub = p.add_subparsers(dest="analytics_command", required=True, metavar="ACTION")
    r = sub.add_parser(
        "refresh",
        help="rebuild the views; print the database, where each export was looked for, the views",
        description="Snapshot the slices of every store in sluice.toml (and --store, if given) "
        "and the replay lineage, compute the rates of new NIC export files, and rebuild every "
        "view of the analytics database.",
    )
    r.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="SCOPE/STREAM=DIR",
        help="an export directory to include (repeatable); the exports of sluice.toml and every "
        "export run's record are included anyway",
    )
    r.add_argument(
        "--slices-stream",
        metavar="SCOPE/STREAM",
        help="also read slices from this stream (besides sluice/slices and each bookmark's)",
    )
    r.set_defaults(func=cmd_refresh)


def _paths() -> AnalyticsPaths:
    from pipeline.analytics.sources import AnalyticsPaths
    from pipeline.settings import load_settings

    return AnalyticsPaths.from_settings(load_settings())


def cmd_refresh(args: argparse.Namespace) -> int:
    from pipeline.analytics.catalog import refresh
    from pipeline.analytics.snapshots import collect_slices, snapshot_slices
    from pipeline.analytics.sources import AnalyticsPaths, discover_exports, parse_export_option
    from pipeline.settings import load_settings

    settings = load_settings()
    paths = AnalyticsPaths.from_settings(settings)
    extra = [parse_export_option(text) for text in args.export]
    exports = discover_exports(settings, extra)
    slices = snapshot_slices(paths, collect_slices(settings, args.store, args.slices_stream))
    rates: list[str] = []
    views = refresh(paths, exports, rates.append)
    print(f"database: {paths.database}")
    for source in exports:
        files = source.parquet_files()
        state = counted(files, "file") if files else "no files yet"
        print(f"export:   {source.name} <- {source.parquet_root} ({state})")
    for line in rates:
        print(f"rates:    {line}")
    print(f"slices:   {slices}")
    print(f"views:    {', '.join(views)}")
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    import sys

    from pipeline.analytics.sandbox import open_database, run
    from pipeline.analytics.sources import AnalyticsError
    from pipeline.cli.table import render

    if not args.sql.strip():  # before the database: an empty query is wrong anywhere
        reason = 'no SQL given: pass a statement, e.g. sluice sql "SELECT * FROM rates LIMIT 5"'
        command = "sluice sql"
        raise AnalyticsError(command, reason)
    with open_database(_paths()) as con:
        columns, rows = run(con, args.sql)
        empty = [] if rows else _sources_without_files(con, args.sql)
    if args.json:
        for row in rows:
            print(json.dumps(dict(zip(columns, row, strict=True)), default=str))
    elif columns:
        print(render(columns, rows, args.max_rows))
    for name, location in empty:
        print(f"note: no exported files of {name} in {location}", file=sys.stderr)
    return 0


def _sources_without_files(con: duckdb.DuckDBPyConnection, query: str) -> list[tuple[str, str]]:
    """The exports with no files yet that `query` reads: through their own views (data and
    quarantine), or a view of every export's files (`EXPORT_VIEWS`); a query of other views
    is not about them."""
    from pipeline.analytics.sources import EXPORT_VIEWS, export_view

    sql = "SELECT name, location FROM sources WHERE kind = 'export' AND files = 0"
    words = {word.lower() for word in re.findall(r"\w+", query)}
    found = []
    for name, location in con.execute(sql).fetchall():
        own = export_view(name).lower()
        if words & {*EXPORT_VIEWS, own, f"{own}_quarantine"}:
            found.append((name, location))
    return found


def cmd_plot_rates(args: argparse.Namespace) -> int:
    from pipeline.analytics.plot import find_export, plot_rates
    from pipeline.analytics.sources import AnalyticsPaths, discover_exports
    from pipeline.jobs.slices import parse_time_ns
    from pipeline.outputs import check_writable
    from pipeline.settings import load_settings

    if args.output is not None:  # a file in the way, a full disk: before any query
        check_writable(args.output, "output file", file=True)
    settings = load_settings()
    paths = AnalyticsPaths.from_settings(settings)
    source = find_export(paths, discover_exports(settings), args.stream)
    start = parse_time_ns(args.start) if args.start else None
    end = parse_time_ns(args.end) if args.end else None
    result = plot_rates(
        paths,
        source,
        start_ns=start,
        end_ns=end,
        output=args.output,
        max_points=args.max_points,
    )
    points, samples = counted(result.points, "point"), counted(result.samples, "sample")
    print(f"wrote {result.path} ({points} from {samples})")
    return 0
