"""`sluice join LEFT RIGHT -o OUT`: the time-series join of two files (`pipeline/timejoin.py`).

The streaming join over two streams is a job: `sluice run join` (`pipeline/cli/run.py`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "join",
        help="time-series join of two files: each record with its nearest predecessor and "
        "successor in the other series",
        description="Join LEFT and RIGHT (Parquet or CSV files with a time column: timestamps, "
        "or numbers in one unit): "
        "each record of either series is paired with the latest record at or before its time "
        "and the earliest at or after it in the other series; each pair once, in an order "
        "that does not depend on how the files were written. The pairs go to --output, as "
        "Parquet or CSV by its extension. See pipeline/timejoin.py.",
    )
    p.add_argument("left", type=Path, help="left series (.parquet or .csv)")
    p.add_argument("right", type=Path, help="right series (.parquet or .csv)")
    p.add_argument(
        "--output",
        "-o",
        type=Path,
        required=True,
        help="output file, written in the format of its extension: .parquet (Parquet) or "
        ".csv (CSV); any other is refused (relative to the working directory, as the inputs "
        "are; never one of the inputs)",
    )
    p.add_argument("--time-column", default="time", help="time column of both files")
    p.add_argument(
        "--max-gap",
        type=float,
        default=None,
        metavar="SECONDS",
        help="drop pairs whose times are more than this apart (a finite number, zero or more; "
        "seconds for timestamps, the column's own unit for numbers)",
    )
    p.set_defaults(func=_run_join)


def _run_join(args: argparse.Namespace) -> int:
    from pipeline.timejoin import join_files

    result = join_files(args.left, args.right, args.output, args.time_column, args.max_gap)
    print(json.dumps({"output": str(args.output), **result.as_dict()}))
    return 0
