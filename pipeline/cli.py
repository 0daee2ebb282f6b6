"""The `sluice` command.

Each area registers its own subcommands: a module in COMMAND_MODULES has
`register(subparsers)`, which adds parsers whose `func(args) -> int | None` runs the command.
Errors that Sluice raises on purpose (`SluiceError`) print as one line and exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pipeline.errors import SluiceError

COMMAND_MODULES = (
    "pipeline.streams.commands",  # sluice store ...
    "pipeline.jobs.replay_commands",  # sluice join / slices / replay ...
    "pipeline.analytics.commands",  # sluice sql / plot / analytics ...
    "collectors.commands",  # sluice collect / collect status
    "pipeline.jobs.commands",  # sluice run mirror / export / console ...
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sensor data from the edge to the cloud, with replayable history.",
    )
    parser.add_argument(
        "--store",
        metavar="URI",
        help="stream store: embedded:<dir> or pravega://host:9090 (default: $SLUICE_STORE, "
        "else embedded:$SLUICE_HOME/streams)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SluiceError as exc:
        print(f"sluice: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
