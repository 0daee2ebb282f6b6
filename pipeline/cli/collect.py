"""`sluice collect [--config collector.toml]`, `sluice collect status [--check]` and
`sluice collect resolve NAME [--auto | --resend | --drop]` (`collectors/resolve.py`).

Without `--config`, `./collector.toml` is read if it exists; instances may also (or only)
come from `PRAVEGA_SENSOR_COLLECTOR_*` environment variables. The global `--store` (a URI or
a store's name in sluice.toml) sets the store of instances that name none. `status --check`
is the health check: exit 1 unless every instance runs and is healthy.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from collectors.settings import CollectorSettings, load_settings
from pipeline.cli import log_level


def register(subparsers: argparse._SubParsersAction) -> None:
    collect = subparsers.add_parser(
        "collect",
        help="run the edge collector (drivers -> SQLite buffer -> stream, exactly-once)",
        description="Run every configured collector instance until SIGTERM, SIGINT or SIGHUP "
        "(each: stop the drivers, send what is buffered for up to drain_timeout_seconds, exit; "
        "a second signal ends the drain at once; what is left stays buffered for the next "
        "start). SIGHUP does not reload: the supervisor's restart reads the configuration anew.",
    )
    _config_option(collect, None)
    collect.add_argument(
        "--log-level",
        default=None,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="the service's log level (default: INFO, or what sluice -v/-q says)",
    )
    collect.set_defaults(func=_run)
    # optional: without one, `sluice collect` runs the collectors
    actions = collect.add_subparsers(dest="collect_action", metavar="[ACTION]")
    status = actions.add_parser("status", help="buffer depth, last committed sample, lag, errors")
    _config_option(status, argparse.SUPPRESS)
    status.add_argument("--json", action="store_true", help="print JSON instead of text")
    status.add_argument(
        "--check",
        action="store_true",
        help="health check: exit 1 unless every instance runs, its driver reaches its source "
        "and its sender the store (within unhealthy_after_seconds)",
    )
    status.set_defaults(func=_status)
    _register_resolve(actions)


def _register_resolve(actions: argparse._SubParsersAction) -> None:
    resolve = actions.add_parser(
        "resolve",
        help="settle doubtful events (their transaction is unknown to the store)",
        description="Doubtful events were sent in a stream transaction the store no longer "
        "knows, so whether the stream holds them cannot be told from the buffer, and the "
        "collector never sends them by itself. Without an option, read the stream and say "
        "of each doubtful transaction whether its events are in it (byte for byte) and what "
        "--auto would do. Only while the instance's collector is stopped.",
    )
    _config_option(resolve, argparse.SUPPRESS)
    resolve.add_argument("name", metavar="NAME", help="the collector instance")
    choice = resolve.add_mutually_exclusive_group()
    choice.add_argument(
        "--auto",
        action="store_const",
        const="auto",
        dest="resolve_action",
        help="drop those whose every event is in the stream, resend those none of whose "
        "events is in it (if it was never truncated); leave the others, saying why",
    )
    choice.add_argument(
        "--resend",
        action="store_const",
        const="resend",
        dest="resolve_action",
        help="they are not in the stream: send them at the next start (after the events "
        "queued now)",
    )
    choice.add_argument(
        "--drop",
        action="store_const",
        const="drop",
        dest="resolve_action",
        help="they are in the stream, or not wanted: delete them from the buffer",
    )
    resolve.set_defaults(func=_resolve, resolve_action="report")


def _config_option(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=default,
        metavar="TOML",
        help="collector configuration (default: ./collector.toml if present)",
    )


def _load(args: argparse.Namespace) -> CollectorSettings:
    from pipeline.config import default_store_uri, sluice_home

    path = args.config
    if path is None and Path("collector.toml").exists():
        path = Path("collector.toml")
    return load_settings(path, os.environ, default_store_uri(), sluice_home(), args.store)


def _run(args: argparse.Namespace) -> int:
    from collectors.failpoints import collector_failpoints
    from collectors.service import run_service

    if args.log_level is not None:
        logging.getLogger().setLevel(args.log_level)
    elif log_level(args) is None:
        logging.getLogger().setLevel(logging.INFO)  # a service says what it does
    settings = _load(args)
    return run_service(settings, collector_failpoints())


def _status(args: argparse.Namespace) -> int:
    from collectors.status import collect_status, format_status

    statuses = collect_status(_load(args))
    if args.json:
        print(json.dumps([s.as_dict() for s in statuses], indent=2))
    else:
        print(format_status(statuses))
    if not args.check:
        return 0
    problems = [f"{s.name}: {p}" for s in statuses for p in s.problems]
    for problem in problems:
        print(f"unhealthy: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _resolve(args: argparse.Namespace) -> int:
    from collectors.errors import ConfigError
    from collectors.resolve import resolve

    settings = _load(args)
    found = [inst for inst in settings.instances if inst.name == args.name]
    if not found:
        names = ", ".join(inst.name for inst in settings.instances) or "none"
        where = str(args.config or "the collector config")
        raise ConfigError(where, f"no instance {args.name}", f"its instances: {names}")
    outcome = resolve(found[0], args.resolve_action, settings.file_modes)
    print("\n".join(outcome.lines))
    return 1 if outcome.unsettled else 0
