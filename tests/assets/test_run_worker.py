"""The warm run worker (`assets/run_worker.py`): runs launched on Sluice's instance are forked
by it when it runs, and go through Dagster's code server when it does not.

The runs are real: a code server started from `workspace.yaml`, the instance's own launcher,
the job that refreshes the analysts' views (DuckDB, no Spark)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.tags import GRPC_INFO_TAG
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

from assets.definitions import build_definitions
from assets.instance import prepare_dagster_home
from assets.run_worker import WORKER_PID_TAG, SluiceRunLauncher, socket_path, start_worker
from tests.assets.conftest import REPO

FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


JOB = "refresh_analytics"


@pytest.fixture
def home(tmp_path) -> Path:
    return prepare_dagster_home(tmp_path / "dagster")


def started(home: Path, log: Path) -> subprocess.Popen[bytes]:
    proc = start_worker(home, log)
    assert socket_path(home).exists(), log.read_text()
    return proc


@pytest.fixture
def worker(home, tmp_path) -> Iterator[subprocess.Popen[bytes]]:
    proc = started(home, tmp_path / "worker.log")
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def launch_and_wait(settings, home: Path, timeout: float = 240.0) -> dg.DagsterRun:
    """Create a run of `JOB` and launch it with the instance's launcher."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.run_launcher, SluiceRunLauncher)
        target = WorkspaceFileTarget(paths=[str(REPO / "workspace.yaml")])
        with WorkspaceProcessContext(instance, target) as workspace:
            context = workspace.create_request_context()
            location = context.get_code_location("sluice")
            (repository,) = location.get_repositories().values()
            remote = repository.get_full_job(JOB)
            run = instance.create_run_for_job(
                job_def=build_definitions(settings).resolve_job_def(JOB),
                remote_job_origin=remote.get_remote_origin(),
                job_code_origin=remote.get_python_origin(),
            )
            instance.launch_run(run.run_id, context)
            deadline = time.monotonic() + timeout
            while (done := instance.get_run_by_id(run.run_id)).status not in FINISHED:
                assert time.monotonic() < deadline, f"the run is still {done.status}"
                time.sleep(0.5)
            return done


def started_in(home: Path, run: dg.DagsterRun) -> int:
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for entry in instance.all_logs(run.run_id):
            message = entry.dagster_event.message if entry.dagster_event else entry.user_message
            found = re.match(r"Started process for run \(pid: (\d+)\)", message or "")
            if found:
                return int(found.group(1))
    msg = "no 'Started process' event"
    raise AssertionError(msg)


@pytest.mark.slow  # a code server and a run: 20 to 45 s
def test_a_run_is_forked_by_the_worker(settings, home, worker):
    run = launch_and_wait(settings, home)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert GRPC_INFO_TAG not in run.tags  # not through the code server
    assert started_in(home, run) == int(run.tags[WORKER_PID_TAG])
    assert worker.poll() is None  # the worker goes on serving


@pytest.mark.slow  # a code server and a run: 20 to 45 s
def test_without_a_worker_runs_go_through_the_code_server(settings, home):
    assert not socket_path(home).exists()
    run = launch_and_wait(settings, home)
    assert run.status == dg.DagsterRunStatus.SUCCESS
    assert WORKER_PID_TAG not in run.tags and GRPC_INFO_TAG in run.tags


@pytest.mark.slow  # a code server and a run: 20 to 45 s
def test_a_killed_worker_leaves_runs_to_the_code_server_and_a_new_one_takes_over(
    settings, home, worker, tmp_path
):
    worker.kill()  # kill -9: its socket file stays behind
    worker.wait()
    assert socket_path(home).exists()
    run = launch_and_wait(settings, home)
    assert run.status == dg.DagsterRunStatus.SUCCESS and WORKER_PID_TAG not in run.tags
    again = started(home, tmp_path / "again.log")
    try:
        run = launch_and_wait(settings, home)
        assert run.status == dg.DagsterRunStatus.SUCCESS and WORKER_PID_TAG in run.tags
    finally:
        again.terminate()
        again.wait(timeout=30)


def ask(path: Path, line: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        conn.sendall(line)
        return json.loads(conn.makefile("rb").readline())


def test_bad_requests_are_refused_and_one_worker_per_instance(home, worker):
    path = socket_path(home)
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert "error" in ask(path, b"not json\n")
    assert "error" in ask(path, b'{"no_run_id": 1}\n')
    second = subprocess.run(
        [sys.executable, "-m", "assets.run_worker", str(home)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert second.returncode != 0 and "already running" in second.stderr
    assert worker.poll() is None and path.exists()


def workers_of(home: Path) -> list[int]:
    """The pids of the run workers started for the instance at `home`."""
    needle = f"-m\0assets.run_worker\0{home}\0".encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


#: In the caller, before `start_worker`: its SIGTERM comes as `Popen` returns, after the fork
#: (the window where a handler that raises left the worker running, with no pid to stop).
SIGTERM_IN_POPEN = (
    "import os, subprocess\n"
    "class SignalledAsItReturns(subprocess.Popen):\n"
    "    def __init__(self, *args, **kwargs):\n"
    "        super().__init__(*args, **kwargs)\n"
    "        os.kill(os.getpid(), signal.SIGTERM)\n"
    "subprocess.Popen = SignalledAsItReturns\n"
)


@pytest.mark.parametrize("when", ["while it imports", "as Popen returns"])
def test_a_caller_stopped_while_its_worker_starts_stops_the_worker(home, tmp_path, when):
    """SIGTERM to a process waiting for the worker it started, whose handler raises
    `SystemExit` (as Ctrl-C raises KeyboardInterrupt): the worker goes with it, never left
    behind."""
    script = (
        "import signal, sys\n"
        "from pathlib import Path\n"
        "from assets.run_worker import start_worker, stop_worker\n"
        "signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))\n"
        + (SIGTERM_IN_POPEN if when == "as Popen returns" else "")
        + f"proc = start_worker(Path({str(home)!r}), Path({str(tmp_path / 'worker.log')!r}))\n"
        # as a caller holds it: the socket may appear between the test's look and its SIGTERM
        "try:\n    signal.pause()\nfinally:\n    stop_worker(proc)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        if when == "while it imports":
            deadline = time.monotonic() + 60
            while not workers_of(home):
                assert caller.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)
            assert not socket_path(home).exists()  # the worker is still importing
            caller.terminate()
        assert caller.wait(timeout=60) == 128 + 15
        deadline = time.monotonic() + 30
        while workers_of(home) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert workers_of(home) == [], (tmp_path / "worker.log").read_text()
    finally:
        caller.kill()
        for pid in workers_of(home):
            os.kill(pid, signal.SIGKILL)
