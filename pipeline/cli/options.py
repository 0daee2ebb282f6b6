"""Options that several commands share, declared once."""

from __future__ import annotations

import argparse


def slices_stream_option(parser: argparse.ArgumentParser) -> None:
    """`--slices-stream`: the stream slices are recorded in (Sluice's default one)."""
    from pipeline.jobs.slices import DEFAULT_SLICES_STREAM

    parser.add_argument(
        "--slices-stream",
        default=DEFAULT_SLICES_STREAM,
        metavar="SCOPE/STREAM",
        help="the stream the slices are recorded in",
    )
