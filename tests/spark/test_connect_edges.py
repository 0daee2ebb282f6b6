"""The warm Spark's edges, as an operator meets them: a state file damaged or copied from
another home, a port another program holds, a server suspended (SIGSTOP) when it is stopped,
a Spark Connect URL that PySpark cannot use (and its token, never shown).

The server stands in as `fake_server` (a sleeper whose command line names the server class
and the port, run in the home as a server is) where the edge is the state file's or the
stop's; `tests/reliability/test_connect_kill.py` kills a real one under a job.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest

from pipeline.spark import connect
from pipeline.spark.errors import PortTaken, SparkLost, StateFileDamaged
from pipeline.spark.session import RemoteSettingError, SparkSettings, remote_url
from tests.spark.killing import job_env


def fake_state(port: int, pid: int) -> dict:
    state = connect.ServerState(
        1, pid, "127.0.0.1", port, "t", sys.executable, str(connect.code_root()), "local[2]",
        2, "", "",
    )  # fmt: skip
    return asdict(state)


def write(home: Path, content: str) -> Path:
    connect.state_dir(home).mkdir(parents=True, exist_ok=True)
    path = connect.state_path(home)
    path.write_text(content)
    return path


DAMAGED = {
    "not JSON": ("{version: 1", "not a JSON object"),
    "a list": ("[1]", "not a JSON object"),
    "fields missing": ('{"version": 1}', "pid is None, not a whole number"),
    "a pid as text": (
        json.dumps({**fake_state(5, 7), "pid": "7"}),
        "pid is '7', not a whole number",
    ),
    "a port out of range": (json.dumps(fake_state(99999, 7)), "pid 7, port 99999"),
    "a pid of 0": (json.dumps(fake_state(5, 0)), "pid 0, port 5"),
    "a boolean port": (json.dumps({**fake_state(5, 7), "port": True}), "port is True"),
}


@pytest.mark.parametrize(("content", "reason"), DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_state_file_is_named_and_never_fails_a_job(
    tmp_path, monkeypatch, caplog, content, reason
):
    """Every `sluice run` reads the state file (`auto`): one damaged by hand failed them all
    with a TypeError or AttributeError, and `sluice spark status|stop` too."""
    path = write(tmp_path, content)
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    assert connect.running_server(tmp_path) is None
    assert remote_url(SparkSettings()) is None  # a job: a local Spark, with a warning
    assert f"the state file {path} is damaged" in caplog.text
    message = f"Spark Connect server: the state file {path} is damaged ({reason}"
    with pytest.raises(StateFileDamaged, match=re.escape(message)):
        connect.server_status(tmp_path)
    with pytest.raises(StateFileDamaged, match=re.escape("`sluice spark stop` stops")):
        connect.start_server(tmp_path, {})
    assert connect.stop_server(tmp_path) is None
    assert not path.exists()


def test_the_status_of_a_damaged_state_file_is_one_line(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    path = write(tmp_path, "[]")
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    assert main(["spark", "status"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"sluice: error: Spark Connect server: the state file {path} is damaged (not a JSON "
        "object): `sluice spark stop` stops the server of this SLUICE_HOME, if one runs, and "
        "removes the file\n"
    )
    assert main(["spark", "stop"]) == 0
    assert not path.exists()


def test_stop_with_a_damaged_state_file_stops_the_server_of_its_home_only(
    tmp_path, monkeypatch, fake_server
):
    home, other = tmp_path / "home", tmp_path / "other"
    home.mkdir(), other.mkdir()
    port = connect.free_port("127.0.0.1")
    monkeypatch.chdir(other)
    elsewhere = fake_server(port)  # the server of another home
    monkeypatch.chdir(home)
    server = fake_server(port)
    write(home, "{damaged")
    assert connect.stop_server(home) is None
    server.wait(timeout=30)
    assert elsewhere.poll() is None


def test_a_server_just_launched_is_known_for_what_it_is(tmp_path, monkeypatch, fake_server):
    """`Popen` returns before the kernel has set up the new process's command line: read at
    once, it is empty (in most of 2,000 tries on a busy machine). A `stop` just after a start
    took the server for some other process, left it running and removed the state file; with
    a damaged state file, as CI met it, it found no server of the home at all."""
    monkeypatch.chdir(tmp_path)
    for _ in range(20):
        port = connect.free_port("127.0.0.1")
        server = fake_server(port)
        assert connect._is_server_process(Path(f"/proc/{server.pid}"), tmp_path, port)
        assert connect._servers_in(tmp_path) == [server.pid]
        server.kill()
        server.wait()


def test_a_state_file_copied_from_another_home_names_no_server_of_this_one(
    tmp_path, monkeypatch, fake_server
):
    """A home copied with its state file (a backup restored, `cp -a`) named the first home's
    server: `status` said it ran, jobs attached to it and `stop` stopped it."""
    home, other = tmp_path / "home", tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(other)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        server = fake_server(port)
        write(other, json.dumps(fake_state(port, server.pid)))
        assert connect.server_status(other)[0] == "running"
        write(home, connect.state_path(other).read_text())
        assert connect.server_status(home)[0] == "stale"
        assert connect.running_server(home) is None
        assert connect.stop_server(home).pid == server.pid
        assert server.poll() is None, "the other home's server was stopped"
        assert connect.server_status(other)[0] == "running"


def test_a_port_another_program_holds_is_refused(tmp_path):
    """`sluice spark start --port P` with P another program's reported "running" at once
    (the other program answered the readiness probe) while the server it launched died on
    its bind, and the state file named that dead server."""
    home = tmp_path / "home"
    job_env(home)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        message = f"Spark Connect server: 127.0.0.1:{port} is taken by another program"
        try:
            with pytest.raises(PortTaken, match=re.escape(message)):
                connect.start_server(home, {"spark.master": "local[1]"}, port=port)
            assert connect.server_status(home) == ("stopped", None)
        finally:  # without the check, a server was launched: stop it
            connect.stop_server(home)
            for pid in connect._servers_in(home):
                connect._terminate(pid)
    for port in (0x10000, -1):
        with pytest.raises(connect.ServerError, match=re.escape(f"port {port}: expected 1")):
            connect.start_server(home, {}, port=port)
    assert connect._servers_in(home) == []


def test_an_ipv6_loopback_host_gets_a_free_port_and_a_taken_one_is_refused(tmp_path):
    """`--host ::1` was a traceback: the free port and the taken-port check used IPv4 sockets."""
    port = connect.free_port("::1")
    assert 0 < port < 65536
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as listener:
        taken = listener.getsockname()[1]
        with pytest.raises(PortTaken, match=re.escape(f"::1:{taken} is taken by another")):
            connect.start_server(tmp_path / "home", {}, host="::1", port=taken)


def test_a_suspended_server_is_stopped_with_its_shutdown(tmp_path):
    """A server suspended (SIGSTOP, Ctrl-Z in its terminal) held the stop's SIGTERM for the
    whole grace and was then killed without its shutdown (Spark's temporary directories
    left behind); it is woken to shut down."""
    done = tmp_path / "shut down"
    script = (
        "import signal, sys, time\n"
        "def down(*_):\n"
        f"    open({str(done)!r}, 'w').close()\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, down)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGSTOP)
        connect._terminate(proc.pid, grace=10)
        assert done.exists(), "killed at the end of the grace, not shut down"
    finally:
        proc.kill()
        proc.wait()


BAD_URLS = {
    "sc://localhost:notaport/;token=SECRET": "its port is not a number from 1 to 65535",
    "sc://localhost:70000/;token=SECRET": "its port is not a number from 1 to 65535",
    "sc:/localhost:15002/;token=SECRET": "not an sc:// URL",
    "sc://localhost:15002/x;token=SECRET": "a path ('/x') where none may be",
    "sc://:15002/;token=SECRET": "no host",
    "sc://localhost:15002/;token=SECRET;use_ssl": "its parameters are not all key=value",
}


@pytest.mark.parametrize(("url", "reason"), BAD_URLS.items(), ids=BAD_URLS.values())
def test_a_url_pyspark_cannot_use_is_refused_without_its_token(url, reason):
    """`notaport` was a ValueError traceback from inside PySpark; `sc:/` (a typo) was refused
    with the token in the message."""
    env = {"SLUICE_SPARK_REMOTE": url}
    shown = url.replace("token=SECRET", "token=…")
    message = f"Spark remote {shown!r}: {reason}; expected `auto`"
    with pytest.raises(RemoteSettingError, match=re.escape(message)) as raised:
        SparkSettings.from_config({}, environ=env)
    assert "SECRET" not in str(raised.value)
    assert "SECRET" not in repr(raised.value.__reduce__())
    assert SparkSettings(remote="sc://localhost:15002/;token=SECRET;use_ssl=false").remote


def test_a_server_lost_mid_run_is_one_line_without_its_token():
    lost = SparkLost("sc://localhost:4242/;token=SECRET")
    assert str(lost) == (
        "the Spark Connect server at sc://localhost:4242 stopped answering (killed, stopped or "
        "restarted): run the job again, it goes on from its checkpoint (on a local Spark if no "
        "server runs: `sluice spark status`)"
    )
    assert "SECRET" not in repr(lost.__reduce__())


@pytest.mark.skipif(os.geteuid() != 0, reason="runs `sluice spark` as another user: root only")
def test_a_state_file_of_another_user_is_named_not_taken_for_none(tmp_path):
    """A SLUICE_HOME shared between users: the server's owner-only state file read as "no
    server" (`status`: stopped) and `stop` failed with a PermissionError traceback."""
    shared = Path(tempfile.mkdtemp(prefix="sluice-shared-"))  # reachable by `nobody`
    try:
        shared.chmod(0o755)
        path = write(shared, json.dumps(fake_state(5, 7)))
        path.parent.chmod(0o755)
        path.chmod(0o600)
        config = shared / "sluice.toml"
        config.write_text("")
        env = {**job_env(tmp_path / "home"), "SLUICE_HOME": str(shared)}
        env["SLUICE_CONFIG"] = str(config)
        nobody = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
        for action in ("status", "stop", "start"):
            argv = [*nobody, sys.executable, "-m", "pipeline.cli", "spark", action]
            done = subprocess.run(
                argv, check=False, env=env, cwd=shared, capture_output=True, text=True, timeout=120
            )
            assert (done.returncode, done.stderr) == (
                1,
                f"sluice: error: Spark Connect server: {path} is another user's: run `sluice "
                "spark` as that user, or give this user a SLUICE_HOME of its own\n",
            )
        assert path.exists()
    finally:
        shutil.rmtree(shared)


def test_a_home_that_cannot_be_written_is_one_line(tmp_path):
    """`sluice spark start` on a read-only home (or one with a file in the way) was an
    `OSError` traceback."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "spark").write_text("a file where the state directory goes")
    said = f"Spark Connect server: cannot write the server's state under {home / 'spark'}"
    with pytest.raises(connect.ServerError, match=re.escape(said)):
        connect.start_server(home, {})
