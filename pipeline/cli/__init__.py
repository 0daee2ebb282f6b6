"""The `sluice` command: one module of this package per command group.

Each module named in COMMANDS has `register(subparsers)`, which adds parsers whose
`func(args) -> int | None` runs the command; domain modules export specs and run functions.
Only the module of the command being run is imported, so `sluice collect` starts on an edge
box that has neither Spark nor DuckDB, and a command whose dependencies are not installed
says which install it needs. Errors that Sluice raises on purpose (`SluiceError`) print as
one line and exit 1; a closed pipe, a full device, Ctrl-C and SIGTERM end every command the
same way (`pipeline.cli.process`).

Before a command runs, `main` refuses `SLUICE_*` variables Sluice does not read, sets the
modes of the files it will write (owner-only unless `SLUICE_GROUP_READ=1`), and turns every
`--store`/`--to-store` (a store's name in sluice.toml, or a URI) into a URI, in one place
(`pipeline.settings.store_uri`), so each command gets a URI.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from pipeline.errors import SluiceError

#: Options that name a store, resolved by `resolve_stores`: attribute -> option.
STORE_OPTIONS = {"store": "--store", "to_store": "--to-store"}
STORE_HELP = (
    "a store's name in sluice.toml ([stores.NAME], e.g. cloud) or a URI: embedded:<dir> (a "
    "relative dir is under $SLUICE_HOME) or pravega://host:9090"
)

#: command -> (module that registers it, one-line help). A module may register several.
COMMANDS: dict[str, tuple[str, str]] = {
    "store": ("pipeline.cli.store", "manage streams in the stream store"),
    "collect": ("pipeline.cli.collect", "run the edge collector (exactly-once into a stream)"),
    "run": ("pipeline.cli.run", "run a streaming job (mirror, export, console, …)"),
    "slices": ("pipeline.cli.slices", "bookmarked pieces of a stream's history"),
    "replay": ("pipeline.cli.replay", "run a model over exactly one slice"),
    "join": ("pipeline.cli.join", "time-series join of two files"),
    "sql": ("pipeline.cli.analytics", "SQL on the analytics database (DuckDB)"),
    "plot": ("pipeline.cli.analytics", "charts from the analytics database"),
    "analytics": ("pipeline.cli.analytics", "the DuckDB analytics database"),
    "spark": ("pipeline.cli.spark", "a warm Spark that jobs attach to (Spark Connect)"),
    "completion": ("pipeline.cli.completion", "print a shell completion script (bash, zsh)"),
}


class MissingInstall(SluiceError):
    def __init__(self, command: str, missing: str) -> None:
        self.command, self.missing = command, missing
        msg = (
            f"`sluice {command}` needs the platform install (uv sync --extra platform, or "
            f"pip install 'sluice[platform]'): module {missing!r} is not installed here"
        )
        super().__init__(msg)


#: Commands that read no sluice.toml, so a broken one does not stop them.
CONFIG_FREE = ("completion",)


def chosen_command(argv: list[str]) -> str | None:
    """The first argument that names a command (after global options such as --store)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--store":
            skip = True
        elif arg in COMMANDS:
            return arg
        elif not arg.startswith("-"):
            return None
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser, with full arguments for `command` (all commands when None)."""
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Sensor data from the edge to the cloud, with replayable history.",
    )
    parser.add_argument("--version", action="version", version=f"sluice {sluice_version()}")
    loudness = parser.add_mutually_exclusive_group()
    loudness.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more on standard error: -v info, -vv debug, and show progress in more "
        "detail (default: warnings and errors; `sluice collect` logs info unless told "
        "otherwise)",
    )
    loudness.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="log only errors on standard error, and show no progress",
    )
    parser.add_argument(
        "--store",
        metavar="STORE",
        help=f"stream store: {STORE_HELP} (default: $SLUICE_STORE, else [stores.edge], else "
        "embedded:$SLUICE_HOME/streams)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = (
        [COMMANDS[command][0]] if command else list(dict.fromkeys(m for m, _ in COMMANDS.values()))
    )
    for module in wanted:
        try:
            importlib.import_module(module).register(subparsers)
        except ModuleNotFoundError:
            if command is not None:
                raise  # `main` says which install the command needs
    for name, (_, help_text) in COMMANDS.items():
        if name not in subparsers.choices:
            subparsers.add_parser(name, help=help_text)
    show_defaults(parser)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but arguments nobody takes are refused by the command they
    were given to, with its usage: `sluice store write --key k` shows `sluice store write`'s
    usage (argparse's own error shows `sluice`'s, whatever the command). A command whose
    options go together in ways a mutually exclusive group cannot say sets a default
    `check_options(args) -> str | None`: what it returns is refused the same way (exit 2)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        at = argv.index(unknown[0]) if unknown[0] in argv else len(argv)
        given_to = [p for p, where in commands_in(parser, args, argv) if where < at][-1]
        given_to.error(f"unrecognized arguments: {' '.join(unknown)}")
    check = getattr(args, "check_options", None)
    if check is not None and (refused := check(args)):
        commands_in(parser, args, argv)[-1][0].error(refused)
    return args


def commands_in(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]
) -> list[tuple[argparse.ArgumentParser, int]]:
    """The (sub)command parsers `args` went through, outermost first, each with where its
    name is in `argv` (-1: the program)."""
    found, where = [(parser, -1)], -1
    while subcommands := [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]:
        name = getattr(args, subcommands[0].dest, None)
        if name not in subcommands[0].choices or name not in argv[where + 1 :]:
            break
        parser, where = subcommands[0].choices[name], argv.index(name, where + 1)
        found.append((parser, where))
    return found


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Help lines end with the option's default when it has one and the line does not say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or "%(default)" in text
            or default in (None, False, [], argparse.SUPPRESS)
            or not action.option_strings
            or isinstance(action, argparse._StoreConstAction)  # a switch: its default is not it
        ):
            return text
        return f"{text} (default: %(default)s)"


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every parser under `parser` that keeps argparse's plain formatter shows defaults."""
    if parser.formatter_class is argparse.HelpFormatter:
        parser.formatter_class = DefaultsHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                show_defaults(sub)


#: Sluice's own packages: a missing one is a broken install, not a missing extra.
OWN_PACKAGES = frozenset({"pipeline", "collectors", "assets", "resources"})


def sluice_version() -> str:
    """The installed distribution's version (the source tree's when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sluice")
    except PackageNotFoundError:
        return "unknown (not installed)"


def log_level(args: argparse.Namespace) -> int | None:
    """The level `-v`/`-q` ask for, or None when neither was given (the command decides)."""
    if args.quiet:
        return logging.ERROR
    if args.verbose:
        return logging.DEBUG if args.verbose > 1 else logging.INFO
    return None


def configure_logging(args: argparse.Namespace, default: int = logging.WARNING) -> None:
    """Log records to standard error (never standard output, which scripts parse)."""
    level = log_level(args)
    level = default if level is None else level
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
    # Never below info: py4j's debug lines drown Sluice's own; its info lines ("Callback
    # Server Starting") only when asked for (-v).
    logging.getLogger("py4j").setLevel(max(level, logging.INFO))


def resolve_stores(args: argparse.Namespace) -> argparse.Namespace:
    """Every store option given, as a URI (`pipeline.settings.store_uri`)."""
    from pipeline.settings import store_uri

    for attribute, option in STORE_OPTIONS.items():
        value = getattr(args, attribute, None)
        if value is not None:
            setattr(args, attribute, store_uri(value, option))
    return args


def main(argv: list[str] | None = None) -> int:
    from pipeline.cli.process import run_command

    argv = sys.argv[1:] if argv is None else argv
    return run_command(lambda: dispatch(argv))


def dispatch(argv: list[str]) -> int:
    """Parse `argv` and run its command; a platform package it lacks is a `MissingInstall`.
    How it ends (an error, a closed pipe, a signal) is `run_command`'s."""
    umask: int | None = None
    root = logging.getLogger()
    logging_before = (root.level, root.handlers[:])
    try:
        from pipeline.config import FileModes
        from pipeline.settings import check_environment, load_settings

        check_environment(os.environ)
        umask = FileModes.from_environment().apply()
        command = chosen_command(argv)
        args = parse(build_parser(command), argv)
        if command not in CONFIG_FREE:
            load_settings()  # the whole sluice.toml, checked before any command reads a part
        args = resolve_stores(args)
        configure_logging(args)
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # a platform package the command imports, when it
        # registers or when it runs: one rule for both
        command = chosen_command(argv)
        if command is None or not exc.name or exc.name.split(".")[0] in OWN_PACKAGES:
            raise
        raise MissingInstall(command, exc.name) from None
    finally:
        if umask is not None:
            os.umask(umask)  # for callers in this process (tests); a process just exits
        root.setLevel(logging_before[0])
        root.handlers[:] = logging_before[1]
