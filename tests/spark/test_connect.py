"""The warm Spark: jobs attach to a Spark Connect server, and survive its kill exactly once.

The server is a real `SparkConnectServer` (`pipeline/spark/connect.py`); the jobs run as
`sluice run …` processes (a process holds either a local or a remote session, and this test
process keeps the suite's local one untouched). The kill takes the whole server at once (its
process group: the JVM and its Python workers), as a driver kill takes the driver.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import duckdb
import pytest

from pipeline.settings import SettingsError
from pipeline.spark import connect
from pipeline.spark.session import RemoteSettingError, SparkSettings, remote_url, spark_conf
from pipeline.streams import open_store
from tests.spark.killing import job_env, kill, run_to_completion, start

KEYS = 5
T0 = 1_609_363_757_807_000_000


def test_remote_setting_is_auto_local_or_a_url():
    assert SparkSettings.from_config({}, environ={}).remote == "auto"
    env = {"SLUICE_SPARK_REMOTE": "sc://localhost:15002"}
    assert (
        SparkSettings.from_config({"spark": {"remote": "local"}}, environ=env).remote
        == env["SLUICE_SPARK_REMOTE"]
    )
    with pytest.raises(RemoteSettingError, match="expected `auto`"):
        SparkSettings(remote="spark://127.0.0.1:7077")


def test_server_max_daemons_setting():
    assert SparkSettings.from_config({}, environ={}).server_max_daemons == 40
    table = {"spark": {"server_max_daemons": 7}}
    assert SparkSettings.from_config(table, environ={}).server_max_daemons == 7
    env = {"SLUICE_SPARK_SERVER_MAX_DAEMONS": "0"}
    assert SparkSettings.from_config(table, environ=env).server_max_daemons == 0
    for bad in ("many", "-1", "2.5"):
        env = {"SLUICE_SPARK_SERVER_MAX_DAEMONS": bad}
        with pytest.raises(SettingsError, match="expected a whole number, 0 or more"):
            SparkSettings.from_config({}, environ=env)


def test_attached_clients_counts_the_connections_to_a_port():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert connect.attached_clients(port) == 0
        with socket.create_connection(("127.0.0.1", port)):
            peer, _ = listener.accept()
            with peer:
                assert connect.attached_clients(port) == 1
                assert connect.attached_clients(port + 1 if port < 65535 else port - 1) == 0
        assert connect.attached_clients(port) == 0


def test_a_probe_connected_to_itself_is_not_a_listening_server(monkeypatch):
    """With nothing listening on a port of the ephemeral range, Linux may hand a probe that
    very port as its own and connect it to itself: a starting server would look ready."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        assert connect.accepts(*listener.getsockname())
    itself = socket.socket()
    itself.bind(("127.0.0.1", 0))
    port = itself.getsockname()[1]
    itself.connect(("127.0.0.1", port))  # TCP simultaneous open: its own peer
    assert itself.getpeername() == itself.getsockname()
    monkeypatch.setattr(connect.socket, "create_connection", lambda *args, **kwargs: itself)
    assert not connect.accepts("127.0.0.1", port)


def wait_for_zombie(pid: int) -> None:
    """Until `/proc/PID/stat` says `Z`: the process's main thread has ended."""
    deadline = time.monotonic() + 30
    while connect._stat_fields(Path(f"/proc/{pid}/stat"))[:1] != ["Z"]:
        assert time.monotonic() < deadline, f"process {pid} did not become a zombie"
        time.sleep(0.02)


def test_a_group_whose_processes_are_zombies_is_not_alive():
    """Stopping a server waits for its process group; a JVM that exited but that its parent
    (another process, busy) has not reaped yet must not keep the stop waiting."""
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        assert connect._group_alive(sleeper.pid)
        wait_for_zombie(done.pid)
        assert not connect._group_alive(done.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
        done.wait()


def test_a_process_whose_main_thread_ended_is_alive_while_its_threads_hold_its_port():
    """A JVM being stopped reads as a zombie once its main thread is gone, while its other
    threads still tear down and hold the server's listening socket: the port still completes
    connections. Stopping must wait for those threads, or a restart on the same port finds
    the old socket "ready" (the CI failure of a restart that was refused seconds later)."""
    script = (
        "import ctypes, socket, sys, threading, time\n"
        "server = socket.create_server(('127.0.0.1', 0))\n"
        "print(server.getsockname()[1], flush=True)\n"
        "threading.Thread(target=time.sleep, args=(3,)).start()\n"
        "ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process goes on\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        port = int(proc.stdout.readline())
        wait_for_zombie(proc.pid)  # its main thread ended
        assert connect.accepts("127.0.0.1", port), "the socket still listens"
        assert connect.pid_alive(proc.pid)
        assert connect._group_alive(proc.pid)
        connect._terminate(proc.pid)  # what a stop does: returns once every thread ended
        assert not connect._group_alive(proc.pid)
        assert not connect.accepts("127.0.0.1", port)
    finally:
        proc.kill()
        proc.wait()


def test_no_server_means_a_local_session(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    assert remote_url(SparkSettings()) is None
    # a state file whose server died (kill -9 leaves it behind) is not attached to
    state = connect.ServerState(
        1, 2**22 + 7, "127.0.0.1", connect.free_port("127.0.0.1"), "t", "py", "/", "local", 2,
        "", "",
    )  # fmt: skip
    connect.state_dir(tmp_path).mkdir(parents=True)
    connect.state_path(tmp_path).write_text(json.dumps(asdict(state)))
    assert connect.server_status(tmp_path)[0] == "stale"
    assert remote_url(SparkSettings()) is None
    assert remote_url(SparkSettings(remote="local")) is None


def test_a_named_server_that_does_not_answer_is_one_line_without_its_token(tmp_path):
    """`remote = "sc://…"` names the server to use: one that does not answer fails the job
    (it was a page of gRPC state), saying what to do; the URL's token is never shown."""
    code = (
        "import pipeline.spark.session as s; s.RECONNECT_RETRIES = 0;"
        "s.spark_session(s.SparkSettings(remote='sc://127.0.0.1:1/;token=secret'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120
    )
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "pipeline.spark.errors.SparkUnreachable: the Spark Connect server at sc://127.0.0.1:1"
        " does not answer: start it"
    ), done.stderr
    assert "secret" not in done.stderr


def test_a_found_server_that_does_not_answer_means_a_local_session(
    tmp_path, fake_server, monkeypatch
):
    """A server found running that stops answering before the job's first call (stopped,
    killed or restarted under it) costs the job its warm start, not its run."""
    home = tmp_path / "home"
    env = job_env(home)
    monkeypatch.chdir(home)  # a server runs in its home (`connect.is_server`)
    with socket.create_server(("127.0.0.1", 0)) as listener:  # accepts, then hangs up
        port = listener.getsockname()[1]
        state = connect.ServerState(
            1, fake_server(port).pid, "127.0.0.1", port, "t", sys.executable,
            str(connect.code_root()), "local[2]", 2, "", "",
        )  # fmt: skip
        connect.write_state(home, state)
        assert connect.running_server(home) is not None

        def hang_up():
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=hang_up, daemon=True).start()
        script = (
            "from pipeline.spark.session import is_remote, spark_session\n"
            "spark = spark_session()\n"
            "print(is_remote(spark), spark.range(5).count())\n"
        )
        argv = [sys.executable, "-c", script]
        done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "5"]
    assert "does not answer; starting a local Spark" in done.stderr


def test_status_says_stopped_and_stop_is_a_no_op(tmp_path, monkeypatch, capsys):
    from pipeline.cli import main

    monkeypatch.setenv("SLUICE_HOME", str(tmp_path))
    assert main(["spark", "status"]) == 3
    assert json.loads(capsys.readouterr().out) == {"status": "stopped"}
    assert main(["spark", "stop"]) == 0
    assert json.loads(capsys.readouterr().out) == {"status": "stopped"}


def nic_payload(i: int, samples: int = 50) -> bytes:
    event = {
        "TimestampNanos": [T0 + (i * samples + k) * 1_000_000 for k in range(samples)],
        "RxBytes": [1000 + k for k in range(samples)],
        "TxBytes": [2000 + k for k in range(samples)],
        "RemoteAddr": "ubuntu",
        "Interface": f"ens{i % KEYS}",
        "LastTimestampFormatted": "2020-12-30T21:29:17.809Z",
    }
    return json.dumps(event).encode()


def append(edge: str, first: int, count: int) -> None:
    with open_store(edge) as store:
        if not store.stream_exists("edge/net"):
            store.create_stream("edge/net", segments=2)
        for start_at in range(first, first + count, 10):
            with store.writer("edge/net") as writer:
                for i in range(start_at, min(first + count, start_at + 10)):
                    writer.write(nic_payload(i), routing_key=f"ens{i % KEYS}")


def assert_mirrored_once(edge: str, cloud: str) -> None:
    with open_store(edge) as source, open_store(cloud) as target:
        sent = [e.payload for e in source.read("edge/net")]
        copied = list(target.read("cloud/net"))
    received = [e.payload for e in copied]
    assert len(received) == len(set(received)), "an event was copied twice"
    assert sorted(received) == sorted(sent), "an event is missing"
    for key in {e.routing_key for e in copied}:
        order = [json.loads(e.payload)["TimestampNanos"][0] for e in copied if e.routing_key == key]
        assert order == sorted(order), f"events of {key} were reordered"


def exported_rows(output) -> tuple[int, int]:
    pattern = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = f"SELECT count(*), count(DISTINCT TimestampNanos) FROM read_parquet('{pattern}')"
    return duckdb.connect().execute(query).fetchall()[0]


@pytest.fixture
def server(tmp_path):
    """A Connect server for the jobs' SLUICE_HOME, stopped (with its workers) afterwards."""
    home = tmp_path / "home"
    env = job_env(home)  # writes home/sluice.toml: local[2], a quick JVM
    conf = spark_conf(SparkSettings(master="local[2]", app_name="test-connect"))
    state = connect.start_server(home, conf)
    try:
        yield home, env, state
    finally:
        connect.stop_server(home)
        assert not connect.pid_alive(state.pid)


def server_log(home: Path) -> str:
    """The end of the server's log (both servers', when it was restarted), for a failure."""
    log = connect.state_dir(home) / "connect.log"
    text = log.read_text(errors="replace") if log.exists() else "(no server log)"
    return "\n--- the Spark Connect server's log ---\n" + text[-6000:]


def job(edge: str, cloud: str, tmp_path, *, export: bool = False, max_events: int = 0) -> list:
    if export:
        argv = ["--store", cloud, "run", "export", "--stream", "cloud/net"]
        argv += ["--schema", "NetworkSamples", "--output", str(tmp_path / "out")]
        argv += ["--format", "parquet", "--checkpoint", str(tmp_path / "ck-export")]
    else:
        argv = ["--store", edge, "run", "mirror", "--stream", "edge/net", "--to", "cloud/net"]
        argv += ["--to-store", cloud, "--checkpoint", str(tmp_path / "ck-mirror")]
    if max_events:
        argv += ["--max-events", str(max_events)]
    return ["-v", *argv]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_jobs_attach_to_the_server_and_survive_its_kill(tmp_path, server):
    home, env, state = server
    edge, cloud = f"embedded:{tmp_path / 'edge'}", f"embedded:{tmp_path / 'cloud'}"
    assert connect.ServerState.read(connect.state_path(home)).matches_this_process()
    assert os.stat(connect.state_path(home)).st_mode & 0o077 == 0, "the token is owner-only"

    # 1. mirror, export and bookmark through the server: the jobs attach (no JVM of their own)
    append(edge, 0, 40)
    bookmark = ["-v", "--store", cloud, "run", "bookmark", "--stream", "cloud/net"]
    bookmark += ["--schema", "NetworkSamples", "--above", "RxBytes=-1"]
    bookmark += ["--checkpoint", str(tmp_path / "ck-bookmark")]
    for argv in (job(edge, cloud, tmp_path), job(edge, cloud, tmp_path, export=True), bookmark):
        life = run_to_completion(argv, env)
        assert "attaching to Spark Connect" in "".join(life.stderr), life.tail()
    # Connect's progress has no total input rows: the bookmark's batch report sums its source's
    assert "bookmark batch 0: 40 events" in "".join(life.stderr), life.tail()
    assert_mirrored_once(edge, cloud)
    assert exported_rows(tmp_path / "out") == (40 * 50, 40 * 50)

    # the jobs left Python daemons behind (Spark never stops them); a server holding too
    # many is restarted, but never under a client
    def conf():
        return spark_conf(SparkSettings(master="local[2]", app_name="test-connect"))

    held = connect.python_daemons(state.pid)
    assert held > 0
    assert connect.recycle_server(home, state, held, conf).pid == state.pid
    with socket.create_connection((state.host, state.port)):
        assert connect.recycle_server(home, state, 0, conf).pid == state.pid

    # 2. kill -9 the server (JVM and Python workers) once the mirror has committed a batch;
    #    the mirror restarts the server first, as every attach does past the daemon limit
    append(edge, 40, 120)
    recycling = {**env, "SLUICE_SPARK_SERVER_MAX_DAEMONS": str(held - 1)}
    life = start(job(edge, cloud, tmp_path, max_events=20), recycling)
    assert life.reported_a_batch(timeout=300), life.tail() + server_log(home)
    assert "restarting the Spark Connect server" in "".join(life.stderr), life.tail()
    assert "starting a local Spark" not in "".join(life.stderr), life.tail() + server_log(home)
    assert not connect.pid_alive(state.pid)
    state = connect.ServerState.read(connect.state_path(home))
    assert connect.pid_alive(state.pid), server_log(home)
    os.killpg(state.pid, signal.SIGKILL)
    deadline = time.monotonic() + 120
    while life.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if life.proc.poll() is None:  # the client must notice; if not, it is a hang: fail loudly
        kill(life)
        pytest.fail("the job did not stop after its Spark Connect server was killed")
    assert life.proc.returncode != 0, life.tail()
    assert connect.server_status(home)[0] == "stale"

    # 3. the rerun finds no server and falls back to a local Spark, from the same checkpoint
    for argv in (job(edge, cloud, tmp_path), job(edge, cloud, tmp_path, export=True)):
        life = run_to_completion(argv, env)
        assert "attaching to Spark Connect" not in "".join(life.stderr)
    assert_mirrored_once(edge, cloud)
    assert exported_rows(tmp_path / "out") == (160 * 50, 160 * 50)
