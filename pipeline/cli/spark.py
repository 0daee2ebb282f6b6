"""`sluice spark start|stop|status`: the warm Spark every job of this `$SLUICE_HOME` attaches to.

`start` runs a Spark Connect server with the configuration a local session would have
(`[spark]` of sluice.toml, `SLUICE_SPARK_*`), bound to loopback behind a random token, and
records it in `$SLUICE_HOME/spark/connect.json` (a Ctrl-C or SIGTERM while it starts stops
it again); from then on `sluice run`, `sluice replay` and Dagster's steps attach to it
instead of starting a JVM each (`SLUICE_SPARK_REMOTE=local` opts out). `--foreground` runs
it in the foreground instead (a container's command), with no state file. The mechanism:
`pipeline/spark/connect.py`; why: `pipeline/spark/DESIGN.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "spark",
        help="a warm Spark (Spark Connect server) that jobs attach to",
        description="Start, stop or inspect the Spark Connect server of this $SLUICE_HOME. "
        "While it runs, every `sluice run`, `sluice replay` and Dagster step attaches to it "
        "(no JVM start-up of their own); when none runs they start a local Spark, as "
        "before. SLUICE_SPARK_REMOTE=local never attaches; SLUICE_SPARK_REMOTE=sc://… "
        "attaches to a server elsewhere.",
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = actions.add_parser("start", help="start the server (a no-op if it runs)")
    start.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; anything but loopback needs TLS and authentication in front "
        "(see docker/README.md, 'Spark Connect')",
    )
    start.add_argument("--port", type=int, default=None, help="port (default: a free one)")
    start.add_argument(
        "--foreground",
        action="store_true",
        help="run in the foreground until stopped, without a state file (a container's "
        "command; clients name it with SLUICE_SPARK_REMOTE=sc://HOST:PORT); authenticates "
        "with $SPARK_CONNECT_AUTHENTICATE_TOKEN when set",
    )
    start.set_defaults(func=_start)
    stop = actions.add_parser("stop", help="stop the server")
    stop.set_defaults(func=_stop)
    status = actions.add_parser(
        "status",
        help="is it running, where, since when (JSON; exit 0 when it runs, 3 when it does not)",
        description="Print the server's status as JSON (with python_daemons while it runs); "
        "exit 0 when it runs, 3 when it does not, as `systemctl status` does.",
    )
    status.set_defaults(func=_status)
    archive = actions.add_parser(
        "archive",
        help="build the archive of Spark's classes that starts local JVMs sooner",
        description="Build, in the foreground, the class-data-sharing archive that every "
        "local Spark session and the server map to start sooner (the first local session "
        "builds it in the background when it is missing; this waits for it instead). "
        "Kept under $XDG_CACHE_HOME/sluice/spark-classes, one per Java and Spark install; "
        "[spark] class_archive = false turns it off.",
    )
    archive.set_defaults(func=_archive)


def _settings():
    from pipeline.config import load_config
    from pipeline.spark.session import SparkSettings, server_session_conf

    return server_session_conf(SparkSettings.from_config(load_config()))


def _public(state) -> dict:
    """What may be printed: everything but the token (it stays in the owner-only file)."""
    from dataclasses import asdict

    shown = {k: v for k, v in asdict(state).items() if k != "token"}
    return {"url": state.url.split("/;")[0], **shown}


def _start(args: argparse.Namespace) -> int:
    from pipeline.config import sluice_home
    from pipeline.errors import sigterm_interrupts
    from pipeline.spark import connect, zip_bytecode

    conf = _settings()
    if args.foreground:
        port = args.port or connect.DEFAULT_PORT
        token = os.environ.get("SPARK_CONNECT_AUTHENTICATE_TOKEN")
        command = connect.server_command(connect.server_conf(conf, args.host, port))
        env = connect.server_environment(token, args.host)
        print(f"sluice: Spark Connect on {args.host}:{port}", file=sys.stderr, flush=True)
        os.execve(command[0], command, env)
    if missing := zip_bytecode.without_bytecode():
        print(f"sluice: warning: {zip_bytecode.bytecode_advice(missing)}", file=sys.stderr)
    home = sluice_home()
    with sigterm_interrupts():  # Ctrl-C or SIGTERM: `start_server` stops what it launched
        state = connect.start_server(home, conf, host=args.host, port=args.port)
    print(
        json.dumps({"status": "running", "state": str(connect.state_path(home)), **_public(state)})
    )
    return 0


def _stop(args: argparse.Namespace) -> int:
    from pipeline.config import sluice_home
    from pipeline.spark import connect

    state = connect.stop_server(sluice_home())
    print(json.dumps({"status": "stopped", **({"pid": state.pid} if state else {})}))
    return 0


def _status(args: argparse.Namespace) -> int:
    from pipeline.config import sluice_home
    from pipeline.spark import connect

    status, state = connect.server_status(sluice_home())
    shown = _public(state) if state else {}
    if status == "running":
        shown["python_daemons"] = connect.python_daemons(state.pid)
    print(json.dumps({"status": status, **shown}))
    return 0 if status == "running" else 3


def _archive(args: argparse.Namespace) -> int:
    from pipeline.spark.class_archive import ArchiveError, archive_path, build

    path = archive_path()
    if path is None:
        msg = "no Java found (JAVA_HOME, or java on PATH); Spark needs one"
        raise ArchiveError(msg)
    if not build(path, wait=True):
        msg = f"the build failed; its log is {path.with_suffix('.log')}"
        raise ArchiveError(msg)
    print(json.dumps({"status": "built", "path": str(path), "bytes": path.stat().st_size}))
    return 0
