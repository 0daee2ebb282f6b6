"""Warm run workers: Dagster runs forked from a process that has already imported everything.

Dagster starts every run as a new Python process (its code server spawns one), which imports
Dagster, Sluice's definitions, pandas and pyspark again: 6 s of CPU on a small machine
(`python -X importtime -c "import assets.definitions"`), and far more when Spark runs beside
it. A catch-up that finds nothing new, or mirrors a second of samples, is mostly that start.

    python -m assets.run_worker [DAGSTER_HOME]

starts the *run worker*: it imports the definitions of `workspace.yaml` once and listens on a
Unix socket; `SluiceRunLauncher` (the instance's `run_launcher`, `assets/instance.py`) asks it
for each run, and it forks a child that executes the run as `dagster api execute_run` would,
ready in milliseconds. Each run is still its own process, its own Spark session (or its own
attachment to the Spark Connect server), its own `kill -9`: nothing is shared between runs but
the imported code. When no worker is running, or it cannot be reached, runs launch the way
Dagster's `DefaultRunLauncher` launches them, through the code server.

- **Who may ask:** the socket lives in a directory only its user can open
  (`$TMPDIR/sluice-<uid>/`), the worker checks the caller's user id (`SO_PEERCRED`), and a
  request names only a run id: the worker executes runs of its own instance, with the code it
  imported.
- **Code changes:** the worker runs the code it imported when it started; restart it after
  changing `assets/` or `pipeline/` (`make ui` and `make demo` start and stop it with Dagster).
- **Cancel:** a forked run's process gets SIGINT, as Dagster's code server interrupts a run.
- **Its environment** is the one runs see, as a code server's is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dagster._core.launcher import DefaultRunLauncher, LaunchRunContext

#: the run tag that names the process a worker forked for the run
WORKER_PID_TAG = "sluice/run_worker_pid"
_REPLY_LIMIT = 4096


class RunWorkerUnavailable(OSError):
    """No run worker took the run: none answered, or it refused."""


class RunWorkerRefused(RunWorkerUnavailable):
    """A run worker answered, and refused."""


def socket_path(dagster_home: Path) -> Path:
    """The worker's socket for the instance at `dagster_home`: short enough for any home
    (a Unix socket's path is limited to 107 bytes), in a directory only this user opens."""
    key = hashlib.sha256(str(dagster_home.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"sluice-{os.getuid()}" / f"runs-{key}.sock"


def ask_for_run(path: Path, run_id: str, timeout: float = 10.0) -> int:
    """Have the worker at `path` fork a process for `run_id`; its pid."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(path))
            conn.sendall(json.dumps({"run_id": run_id}).encode() + b"\n")
            reply = json.loads(conn.makefile("rb").readline(_REPLY_LIMIT) or b"{}")
    except (OSError, ValueError) as exc:
        msg = f"no run worker at {path}: {exc}"
        raise RunWorkerUnavailable(msg) from exc
    if "pid" not in reply:
        msg = f"the run worker at {path} refused: {reply.get('error')}"
        raise RunWorkerRefused(msg)
    return int(reply["pid"])


class SluiceRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher, which hands each run to the instance's warm run worker
    when one is running (`python -m assets.run_worker`)."""

    def _worker_socket(self) -> Path:
        return socket_path(Path(self._instance.root_directory))

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        try:
            pid = ask_for_run(self._worker_socket(), run.run_id)
        except RunWorkerUnavailable:
            super().launch_run(context)  # through the code server, as Dagster does
            return
        self._instance.add_run_tags(run.run_id, {WORKER_PID_TAG: str(pid)})
        self._run_ids.add(run.run_id)

    def terminate(self, run_id: str) -> bool:
        run = self._instance.get_run_by_id(run_id)
        if run is None or run.is_finished or WORKER_PID_TAG not in run.tags:
            return super().terminate(run_id)
        self._instance.report_run_canceling(run)
        try:
            os.kill(int(run.tags[WORKER_PID_TAG]), signal.SIGINT)
        except ProcessLookupError:
            return False
        return True


def start_worker(
    dagster_home: Path, log: Path, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.Popen[bytes]:
    """`python -m assets.run_worker` for the instance at `dagster_home` in a process group of
    its own (stopping the group stops the runs it forked), logging to `log`; returned once its
    socket is there, or once it has exited or `timeout` has passed (check `socket_path`)."""
    path, deadline = socket_path(dagster_home), time.monotonic() + timeout
    proc = None
    try:
        with log.open("ab") as out, _signals_held(signal.SIGINT, signal.SIGTERM):
            proc = subprocess.Popen(
                [sys.executable, "-m", "assets.run_worker", str(dagster_home)],
                cwd=Path(__file__).resolve().parents[1],
                env=dict(os.environ if env is None else env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    except BaseException:  # the caller was interrupted while it started: it goes too
        if proc is not None:
            stop_worker(proc)
        raise
    return proc


@contextlib.contextmanager
def _signals_held(*signums: int) -> Iterator[None]:
    """Signals of `signums` that come in this block reach their Python handlers as it ends.
    A handler that raises (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's `SystemExit`)
    inside `Popen`, after the fork, leaves the child running and its pid unknown to the
    caller, who cannot stop it. Main thread only (elsewhere nothing is held), and only
    handlers set from Python: a default action is not the caller's to delay."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    earlier = {s: h for s in signums if callable(h := signal.getsignal(s))}
    for signum in earlier:
        signal.signal(signum, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        for signum, handler in earlier.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(came):
            signal.raise_signal(signum)  # its handler runs here, in the caller's frame


def stop_worker(proc: subprocess.Popen[bytes], grace_seconds: float = 30.0) -> None:
    """Stop the worker `start_worker` started, and the runs it forked (its process group):
    SIGTERM, then SIGKILL after `grace_seconds`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# --- the worker ----------------------------------------------------------------------------


def warm_up() -> None:
    """Import what every run imports before any fork: building the definitions once imports
    every module they use. (Each run builds them again from `sluice.toml`, as a new process
    does, so a changed `sluice.toml` is read by the next run.)"""
    import pyspark.sql  # noqa: F401  (the Spark session and the Connect client)

    from assets.definitions import build_definitions
    from pipeline.settings import load_settings

    build_definitions(load_settings()).get_repository_def()


def execute_run(dagster_home: Path, run_id: str) -> int:
    """In a forked child: execute `run_id` as `dagster api execute_run` does."""
    import dagster as dg
    from dagster._cli.api import _execute_run_command_body
    from dagster._utils.interrupts import capture_interrupts

    with capture_interrupts(), dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        return _execute_run_command_body(
            run_id, instance, lambda event: None, set_exit_code_on_failure=True
        )


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _reap(signum: int, frame: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def listen(path: Path) -> socket.socket:
    """The worker's listening socket; refuses a second worker for the same instance."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path.parent, 0o700)
    try:
        ask_for_run(path, "", timeout=1.0)  # a probe: a live worker answers it with an error
    except RunWorkerRefused:
        msg = f"run worker: one is already running at {path}"
        raise SystemExit(msg) from None
    except RunWorkerUnavailable:
        path.unlink(missing_ok=True)  # nobody listens: a worker that died left it
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    return server


def serve(dagster_home: Path, server: socket.socket, log: Any) -> None:
    """Fork a child per request until SIGTERM or SIGINT."""
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            conn, _ = server.accept()
        except InterruptedError:
            continue
        with conn:
            if _peer_uid(conn) != os.getuid():
                conn.sendall(b'{"error": "only the worker\'s own user may launch runs"}\n')
                continue
            conn.settimeout(5.0)  # a caller that never sends does not hold the worker
            try:
                request = json.loads(conn.makefile("rb").readline(_REPLY_LIMIT))
                run_id = str(request["run_id"])
            except (OSError, ValueError, KeyError, TypeError):
                with contextlib.suppress(OSError):
                    conn.sendall(b'{"error": "a request is one JSON line with a run_id"}\n')
                continue
            if not run_id:
                conn.sendall(b'{"error": "no run id (a probe)"}\n')
                continue
            pid = os.fork()
            if pid == 0:
                _child(dagster_home, run_id, server, conn, log)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            print(f"run worker: run {run_id} in process {pid}", file=log, flush=True)


def _child(dagster_home: Path, run_id: str, server: socket.socket, conn: socket.socket, log: Any):
    code = 1
    try:
        server.close()
        conn.close()
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL)
        # The run stays in the worker's process group, as a code server's runs stay in its
        # group: stopping the group (`make ui`'s Ctrl-C, the demo's stop) stops them too.
        code = execute_run(dagster_home, run_id)
    except BaseException as exc:
        print(f"run worker: run {run_id} failed to start: {exc!r}", file=log, flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    import argparse

    from assets.instance import prepare_dagster_home
    from pipeline.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m assets.run_worker", description=__doc__)
    parser.add_argument("dagster_home", nargs="?", type=Path, help="default: Sluice's instance")
    args = parser.parse_args(argv)
    home = prepare_dagster_home(args.dagster_home or load_settings().dagster_home)
    path = socket_path(home)
    server = listen(path)
    warm_up()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    print(f"run worker: ready at {path} for the instance {home}", flush=True)
    try:
        serve(home, server, sys.stdout)
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        server.close()
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    sys.exit(main())
