"""Starting and stopping the Spark Connect server: a start interrupted while the server
starts (Ctrl-C, SIGTERM, kill -9 of `sluice spark start`) leaves no server nobody knows of,
and a process the state file names is signalled only if it is that server (pids are reused).

The fast tests stand a sleeper in for the server (`fake_server`: its command line names the
server class and the port); the slow ones interrupt a real `sluice spark start`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.spark import connect
from tests.spark.killing import ROOT, job_env


def fake_state(port: int, pid: int) -> connect.ServerState:
    return connect.ServerState(
        1, pid, "127.0.0.1", port, "t", sys.executable, str(connect.code_root()), "local[2]",
        2, "", "",
    )  # fmt: skip


def test_a_server_not_accepting_yet_is_starting_and_stop_stops_it(
    tmp_path, fake_server, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a server runs in its home (`connect.is_server`)
    port = connect.free_port("127.0.0.1")
    server = fake_server(port)
    connect.write_state(tmp_path, fake_state(port, server.pid))
    assert connect.server_status(tmp_path)[0] == "starting"
    assert connect.running_server(tmp_path) is None
    assert connect.stop_server(tmp_path).pid == server.pid
    # Ended (its exit status may read 0: it is this process's child, and `stop_server`
    # may reap it before `wait` does).
    server.wait(timeout=30)
    assert not connect.pid_alive(server.pid)
    assert not connect.state_path(tmp_path).exists()


def test_a_reused_pid_is_not_the_server_and_is_never_signalled(tmp_path, fake_server, monkeypatch):
    """A state file left by a killed server names a pid that another process may hold by
    now (another server's, even, and its port may answer): it is stale, and `stop` leaves that
    process alone."""
    monkeypatch.chdir(tmp_path)  # `other` runs in this home: its port alone tells it apart
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        other = fake_server(port + 1)  # a server of another port: not this state's
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        try:
            for pid in (other.pid, stranger.pid):
                connect.write_state(tmp_path, fake_state(port, pid))
                assert connect.server_status(tmp_path)[0] == "stale"
                assert connect.running_server(tmp_path) is None
                assert connect.stop_server(tmp_path).pid == pid
                assert not connect.state_path(tmp_path).exists()
                assert other.poll() is None
                assert stranger.poll() is None
        finally:
            stranger.kill()
            stranger.wait()


# --- a real `sluice spark start`, interrupted while its server starts ---------------------


def servers(home: Path) -> list[int]:
    """The live Spark Connect servers started for `home`, by what they are rather than by a
    state file: a process group's leader running in `home` whose command line names the
    server class (the launcher JVM `spark-submit` runs first names it too, in the group)."""
    found = []
    for proc, fields in connect._proc_stats():
        if fields[2] != proc.name:
            continue
        try:
            in_home = os.readlink(proc / "cwd") == str(home.resolve())
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if in_home and connect.SERVER_CLASS.encode() in args and connect.pid_alive(int(proc.name)):
            found.append(int(proc.name))
    return sorted(found)


@pytest.fixture
def home(tmp_path):
    """A SLUICE_HOME for `sluice spark` commands; every server started for it (the state file
    may name none of them) is killed afterwards, with its process group."""
    home = tmp_path / "home"
    job_env(home)  # writes home/sluice.toml: local[2], a quick JVM
    try:
        yield home
    finally:
        connect.stop_server(home)
        for pid in servers(home):
            os.killpg(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while servers(home) and time.monotonic() < deadline:
            time.sleep(0.1)


def sluice_spark(home: Path, action: str, prelude: str = "") -> subprocess.Popen:
    """`sluice spark ACTION` for `home`, with Ctrl-C raising KeyboardInterrupt as in a
    terminal (a process a shell starts in the background inherits SIGINT ignored); `prelude`
    is Python run first."""
    script = (
        "import signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"{prelude}"
        "from pipeline.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    argv = [sys.executable, "-c", script, "spark", action]
    return subprocess.Popen(
        argv, env=job_env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run(home: Path, action: str) -> dict:
    proc = sluice_spark(home, action)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def launched_server(home: Path, starter: subprocess.Popen) -> int:
    """The server `starter` launched, once it runs as a JVM (past `spark-submit`'s scripts):
    the start is then waiting for it to accept connections, which takes seconds more."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert starter.poll() is None, starter.communicate()[1][-3000:]
        for pid in servers(home):
            try:
                if Path(os.readlink(f"/proc/{pid}/exe")).name == "java":
                    return pid
            except OSError:
                continue
        time.sleep(0.05)
    pytest.fail("`sluice spark start` launched no server JVM in 120 s")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_start_interrupted_while_the_server_starts_leaves_no_server(home, signum):
    starter = sluice_spark(home, "start")
    server = launched_server(home, starter)
    starter.send_signal(signum)
    _, err = starter.communicate(timeout=120)
    assert servers(home) == [], f"the server {server} outlived its interrupted start"
    # the shell's convention: 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)
    assert starter.returncode == 128 + signum, err[-3000:]
    assert not connect.state_path(home).exists()


@pytest.mark.slow
def test_a_start_killed_while_the_server_starts_is_waited_for_then_stopped(home):
    starter = sluice_spark(home, "start")
    server = launched_server(home, starter)
    starter.kill()
    starter.wait()
    # the next start waits for the server still starting rather than start one beside it
    assert run(home, "start")["pid"] == server
    assert servers(home) == [server]
    assert run(home, "stop") == {"status": "stopped", "pid": server}
    assert servers(home) == []


@pytest.mark.slow
def test_two_starts_at_once_start_one_server(home):
    """Two `sluice spark start` at the same instant (`make ui` and a script, say): one
    launches, the other waits for it and reports the same server. Each start takes a second
    to choose its port, so that both look for a server before either has launched one."""
    slow_port = (
        "import time\n"
        "from pipeline.spark import connect\n"
        "free_port = connect.free_port\n"
        "connect.free_port = lambda host: (time.sleep(1), free_port(host))[1]\n"
    )
    starters = [sluice_spark(home, "start", slow_port) for _ in range(2)]
    reports = []
    for starter in starters:
        out, err = starter.communicate(timeout=300)
        assert starter.returncode == 0, err[-3000:]
        reports.append(json.loads(out))
    assert reports[0]["pid"] == reports[1]["pid"]
    assert servers(home) == [reports[0]["pid"]]
