"""A warm Spark: one Spark Connect server that every `sluice run` and Dagster step attaches to.

`start_server` runs pyspark's own `SparkConnectServer` (what `sbin/start-connect-server.sh`
starts) with the configuration a local session would have (the caller passes
`pipeline.spark.session.spark_conf`), bound to loopback,
behind a random token, with its Python workers importing the same `pipeline` package from
the same interpreter as the caller; it records itself in `$SLUICE_HOME/spark/connect.json`
(`ServerState`), which `running_server` reads to let a session attach to it
(`pipeline/spark/session.py`). `stop_server` stops it. `sluice spark start|stop|status` is the
command line; why and how: `DESIGN.md`, "A warm Spark".
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pipeline import durable
from pipeline.spark.errors import PortTaken, ServerError, StateFileDamaged

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STATE_VERSION = 1
DEFAULT_PORT = 15002  # Spark Connect's own default


def code_root() -> Path:
    """The directory that holds the `pipeline` package this process runs."""
    import pipeline

    return Path(pipeline.__file__).resolve().parents[1]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def state_dir(home: Path) -> Path:
    return home / "spark"


def state_path(home: Path) -> Path:
    return state_dir(home) / "connect.json"


@dataclass(frozen=True, slots=True)
class ServerState:
    """What `$SLUICE_HOME/spark/connect.json` says about a running server (version 1).

    The token authenticates clients (`spark.connect.authenticate.token`); the file is
    owner-only, like everything Sluice writes unless `SLUICE_GROUP_READ=1`."""

    version: Literal[1]
    pid: int
    host: str
    port: int
    token: str
    python: str
    code_root: str
    master: str
    parallelism: int
    started_at: str
    log: str

    @property
    def url(self) -> str:
        """The `sc://` URL a client attaches with. Loopback is named `localhost` because
        the Python client sends a token without TLS only to that name (gRPC local
        credentials); anywhere else it insists on TLS."""
        host = "localhost" if self.host in ("127.0.0.1", "localhost", "::1") else self.host
        return f"sc://{host}:{self.port}/;token={self.token}"

    def matches_this_process(self) -> bool:
        """True when the server's Python workers run this interpreter and this code."""
        return self.python == sys.executable and self.code_root == str(code_root())

    @classmethod
    def read(cls, path: Path) -> ServerState | None:
        """The state in `path`: None if there is none (or one of another version, which
        this Sluice does not read); `StateFileDamaged` if it is not one Sluice wrote (not
        JSON, a field missing or of another type, a port or pid that cannot be one)."""
        try:
            text = path.read_text()
        except (FileNotFoundError, NotADirectoryError):  # no state file, nor room for one
            return None
        except PermissionError:
            msg = (
                f"{path} is another user's: run `sluice spark` as that user, or give this "
                "user a SLUICE_HOME of its own"
            )
            raise ServerError(msg) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise StateFileDamaged(path, f"unreadable: {exc}") from None
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise StateFileDamaged(path, "not a JSON object")
        if data.get("version") != STATE_VERSION:
            return None
        values = {}
        for name, kind in _FIELD_TYPES.items():
            value = data.get(name)
            if type(value) is not kind:  # bool is no int here
                noun = "a whole number" if kind is int else "text"
                raise StateFileDamaged(path, f"{name} is {value!r}, not {noun}")
            values[name] = value
        if values["pid"] <= 0 or not 0 < values["port"] < 65536:
            reason = f"pid {values['pid']}, port {values['port']}: no process or no TCP port"
            raise StateFileDamaged(path, reason)
        return cls(version=STATE_VERSION, **values)


#: The types of `ServerState`'s fields after its version, as its file must hold them.
_FIELD_TYPES = {
    f.name: int if f.type == "int" else str for f in dataclasses.fields(ServerState)[1:]
}


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs: a zombie (exited, not reaped yet) does not; one
    whose main thread ended while other threads still run does (`_threads_alive`)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _threads_alive(Path(f"/proc/{pid}"), default=True)


def _threads_alive(proc: Path, *, default: bool = False) -> bool:
    """Whether a thread of the process at `proc` (`/proc/PID`) still runs. Its main thread's
    `stat` is not enough: a JVM ending reads as a zombie (`Z`) once its main thread is gone,
    while its other threads still tear down and hold its files, the server's listening socket
    among them; a connect to that port then still succeeds, as the kernel completes
    handshakes for a listening socket no one accepts on. `default` when `/proc` cannot say."""
    try:
        tasks = list((proc / "task").iterdir())
    except OSError:
        return default
    states = (_stat_fields(task / "stat")[:1] for task in tasks)  # [] for a thread gone since
    return any(state and state[0] not in ("Z", "X") for state in states)


def accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether a server listens on `host:port`. A connection to itself does not count: with
    nothing listening on a port of the ephemeral range (where a server's port comes from),
    Linux may give the probe that very port as its own and connect it to itself (TCP
    simultaneous open)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            return sock.getsockname() != sock.getpeername()
    except OSError:
        return False


def is_server(state: ServerState, home: Path) -> bool:
    """Whether the process `state` names is alive and is the server of `home`: its command
    line (`spark-submit`'s, then the JVM's) names the server class and the state's port, and
    it runs in `home` (where `start_server` starts it). The pid of a stale state file may be
    another process's by now, and a state file copied from another home names that home's
    server: such a process is never waited on or signalled."""
    if not pid_alive(state.pid):
        return False
    return _is_server_process(Path(f"/proc/{state.pid}"), home, state.port)


def _is_server_process(proc: Path, home: Path, port: int | None = None) -> bool:
    """Whether the process at `proc` (`/proc/PID`) is a server `start_server` started for
    `home` (on `port`, when given)."""
    try:
        if os.readlink(proc / "cwd") != str(home.resolve()):
            return False
        args = _arguments(proc)
    except OSError:
        return False
    if SERVER_CLASS.encode() not in args:
        return False
    return port is None or f"spark.connect.grpc.binding.port={port}".encode() in args


def _arguments(proc: Path, settle: float = 2.0) -> list[bytes]:
    """The command line of the process at `proc`. A process in the middle of an `exec` (just
    launched: `Popen` returns before the kernel has set up its new arguments; or `spark-submit`
    handing over to the JVM) shows none for a moment: it is read again until it shows, for up
    to `settle` s. [] for a process that has ended (a zombie shows none for good)."""
    deadline = time.monotonic() + settle
    while not (args := (proc / "cmdline").read_bytes()):
        state = _stat_fields(proc / "stat")[:1]
        if state in ([], ["Z"], ["X"]) or time.monotonic() > deadline:
            return []
        time.sleep(0.005)
    return args.split(b"\0")


def _servers_in(home: Path) -> list[int]:
    """The pids of the servers started for `home` that still run, found by what they are
    (`_is_server_process`, each its process group's leader) rather than by a state file."""
    return [
        int(proc.name)
        for proc, fields in _proc_stats()
        if fields[2] == proc.name and fields[0] not in ("Z", "X") and _is_server_process(proc, home)
    ]


def running_server(home: Path) -> ServerState | None:
    """The Sluice-managed server of `home`, if it runs (`is_server`) and its port answers.
    None, with a warning, if the state file is damaged or another user's: a job then runs on
    a local Spark."""
    try:
        state = ServerState.read(state_path(home))
    except ServerError as exc:  # StateFileDamaged, another user's
        log.warning("not attaching to a Spark Connect server: %s", exc)
        return None
    if state is None or not is_server(state, home) or not accepts(state.host, state.port):
        return None
    return state


def parallelism(master: str) -> int:
    """Cores a `local[N]` master uses (`local[*]`: this machine's); 2 for a cluster, whose
    executors Spark adds later (the `sluice` source plans at least 2 partitions anyway)."""
    found = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]|local", master)
    if found is None:
        return 2
    count = found.group(1)
    return os.cpu_count() or 2 if count in (None, "*") else int(count)


def server_conf(session_conf: Mapping[str, str], host: str, port: int) -> dict[str, str]:
    """A local session's configuration (`spark_conf`), plus the server's own."""
    conf = dict(session_conf)
    master = conf.get("spark.master", "local[*]")
    conf.setdefault("spark.default.parallelism", str(parallelism(master)))
    conf.update(
        {
            "spark.connect.grpc.binding.address": host,
            "spark.connect.grpc.binding.port": str(port),
            # a step of a catch-up reads its source's tail, plans and commits in the
            # server's Python workers: keep them, and the data source's planner, warm
            "spark.python.worker.reuse": "true",
            # Every client process is a new Spark Connect session, and a session whose
            # artifacts are isolated gets Python daemons of its own (their environment names
            # the session), started cold and never reused. Sluice's clients add no
            # artifacts (the server imports the code it was started with), so share them.
            "spark.sql.artifact.isolation.enabled": "false",
        }
    )
    return conf


def server_command(conf: dict[str, str], name: str = "sluice-spark-connect") -> list[str]:
    command = [str(spark_home() / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    command += ["--name", name]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def server_environment(token: str | None, host: str) -> dict[str, str]:
    """The server's environment: the token (never on its command line, which `ps` shows), and
    Python workers that import this process's `pipeline` with this interpreter."""
    env = dict(os.environ)
    path = [str(code_root()), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP=host,
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(dict.fromkeys(path)),
    )
    env.pop("SPARK_CONNECT_AUTHENTICATE_TOKEN", None)
    if token is not None:
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token
    env.pop("SPARK_REMOTE", None)
    env.pop("SPARK_CONNECT_MODE_ENABLED", None)
    return env


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET  # `::1`, an IPv6 address


def free_port(host: str) -> int:
    with socket.socket(_family(host)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    """Whether a server could listen on `host:port`: no other socket listens there (one in
    TIME_WAIT, left by a server just stopped, does not count: the JVM reuses the address)."""
    try:
        socket.create_server((host, port), family=_family(host)).close()
    except OSError:
        return False
    return True


def start_server(
    home: Path,
    session_conf: Mapping[str, str],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout: float = 120.0,
) -> ServerState:
    """Start a server for `home` and wait until it accepts connections; if one runs, or is
    starting (its starter may have been killed), wait for that one instead. The state file is
    written as soon as the server is launched, so `stop_server` finds a server still starting;
    a start interrupted here (Ctrl-C, or the CLI's SIGTERM) stops it and removes the file.
    `host` other than loopback needs TLS and an authenticating proxy in front (`DESIGN.md`);
    the token alone travels in clear text without TLS. One start at a time: a second one
    waits for the first and then finds its server."""
    ServerState.read(state_path(home))  # damaged, another user's: say so before the lock
    try:
        state_dir(home).mkdir(mode=0o700, parents=True, exist_ok=True)
        lock_file = (state_dir(home) / "start.lock").open("a")
    except PermissionError:
        msg = f"{state_dir(home)} is another user's: give this user a SLUICE_HOME of its own"
        raise ServerError(msg) from None
    except OSError as exc:  # a read-only or full disk, a file in the way
        msg = (
            f"cannot write the server's state under {state_dir(home)} ({exc.strerror or exc}): "
            "set SLUICE_HOME to a writable directory"
        )
        raise ServerError(msg) from None
    with lock_file as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released by the kernel if this process is killed
        return _start_locked(home, session_conf, host, port, timeout)


def _start_locked(
    home: Path, session_conf: Mapping[str, str], host: str, port: int | None, timeout: float
) -> ServerState:
    found = ServerState.read(state_path(home))  # StateFileDamaged: `stop` first
    if found is not None and is_server(found, home):
        if _until_accepting(found, timeout, alive=lambda: is_server(found, home)):
            return found
    if port is None or port == 0:
        port = free_port(host)
    elif not 0 < port < 65536:
        msg = f"port {port}: expected 1 to 65535, or none for a free one"
        raise ServerError(msg)
    elif not _bindable(host, port):  # else the other program would answer for the server
        raise PortTaken(host, port)
    token = secrets.token_urlsafe(32)
    log = state_dir(home) / "connect.log"
    conf = server_conf(session_conf, host, port)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            server_command(conf),
            env=server_environment(token, host),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal that started it is not for it
            cwd=home,
        )
    state = ServerState(
        version=STATE_VERSION,
        pid=proc.pid,
        host=host,
        port=port,
        token=token,
        python=sys.executable,
        code_root=str(code_root()),
        master=conf.get("spark.master", "local[*]"),
        parallelism=int(conf["spark.default.parallelism"]),
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        log=str(log),
    )
    try:
        write_state(home, state)
        if not _until_accepting(state, timeout, alive=lambda: proc.poll() is None):
            msg = f"exited with code {proc.returncode} while starting"
            raise ServerError(msg, log)
    except BaseException:  # a failed start, Ctrl-C, SIGTERM made KeyboardInterrupt
        _terminate(proc.pid)
        if ServerState.read(state_path(home)) == state:
            state_path(home).unlink()
        raise
    return state


def _until_accepting(state: ServerState, timeout: float, alive: Callable[[], bool]) -> bool:
    """Wait until the server of `state` accepts connections (True), or its process ends
    (False). One that does neither within `timeout` s is stopped, and ServerError raised."""
    deadline = time.monotonic() + timeout
    while not accepts(state.host, state.port):
        if not alive():
            return False
        if time.monotonic() > deadline:
            _terminate(state.pid)
            msg = f"not accepting connections on {state.host}:{state.port} after {timeout} s"
            raise ServerError(msg, Path(state.log))
        time.sleep(0.1)
    return True


def write_state(home: Path, state: ServerState) -> None:
    """The state file, owner-only whatever the umask (it holds the token)."""
    with durable.atomic_path(state_path(home)) as staging:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(dataclasses.asdict(state), out, indent=2)


def _terminate(pid: int, grace: float = 30.0) -> None:
    """SIGTERM the server's process group (the JVM and its Python workers), then SIGKILL.
    SIGCONT follows the SIGTERM: a group stopped (SIGSTOP, Ctrl-Z) would otherwise hold the
    SIGTERM for the whole grace and be killed without its shutdown (Spark's temporary
    directories left behind)."""
    try:
        os.killpg(pid, signal.SIGTERM)
        os.killpg(pid, signal.SIGCONT)
    except ProcessLookupError:
        return
    except PermissionError:
        msg = f"process {pid} is another user's: stop it as that user"
        raise ServerError(msg) from None
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not _group_alive(pid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _reap(pid)


def _proc_stats() -> Iterator[tuple[Path, list[str]]]:
    """Each process's `/proc/PID` directory and the fields of its `stat` after the command
    name (state, ppid, pgrp, …); a process gone meanwhile is skipped."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(stat)
        if len(fields) > 2:
            yield stat.parent, fields


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a `/proc/…/stat` file after the command name; [] if it is gone."""
    try:
        return stat.read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def _group_alive(group: int) -> bool:
    """Whether a process of the group still runs: a zombie does not (its parent, maybe not
    this process, has yet to reap it), unless threads of it still run (`_threads_alive`)."""
    return any(
        f[2] == str(group) and (f[0] != "Z" or _threads_alive(proc)) for proc, f in _proc_stats()
    )


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def stop_server(home: Path) -> ServerState | None:
    """Stop the server of `home`, running or still starting: what the state file named (None
    if none), the file removed. A process the file names that is not the server
    (`is_server`: the pid was reused) is left alone. A damaged state file names nothing: the
    servers started for `home` are found by what they are (`_servers_in`) and stopped."""
    path = state_path(home)
    try:
        state = ServerState.read(path)
    except StateFileDamaged as exc:
        log.warning("%s; stopping the servers started for %s", exc, home)
        for pid in _servers_in(home):
            _terminate(pid)
        path.unlink(missing_ok=True)
        return None
    if state is not None and is_server(state, home):
        _terminate(state.pid)
    path.unlink(missing_ok=True)
    return state


def python_daemons(pid: int) -> int:
    """How many Python worker daemons the server holds (Spark keeps one per session and
    step, never reaping them: `DESIGN.md`, "Where a catch-up's time goes")."""
    count = 0
    for proc, fields in _proc_stats():
        if fields[1] == str(pid):
            try:
                count += b"pyspark.daemon" in (proc / "cmdline").read_bytes()
            except OSError:
                continue
    return count


def attached_clients(port: int) -> int:
    """Established TCP connections to `port` on this machine: a Connect client holds one for
    as long as its session is open."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            established = len(fields) > 3 and fields[3] == "01"
            if established and int(fields[1].rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def recycle_server(
    home: Path, server: ServerState, max_daemons: int, session_conf: Callable[[], Mapping]
) -> ServerState | None:
    """The server of `home` to attach to (`server`, as just found running; None when none
    runs any more), restarted first (same address, and the same port when it is free again)
    if it holds more than `max_daemons` Python daemons and no client is attached. One
    process restarts it at a time; the others wait for it and attach to the new one.
    `session_conf` is asked only for a restart."""
    if python_daemons(server.pid) <= max_daemons:
        return server
    with (state_dir(home) / "recycle.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = running_server(home)  # another process may have restarted it meanwhile
        if state is None or attached_clients(state.port):
            return state
        held = python_daemons(state.pid)
        if held <= max_daemons:
            return state
        log.info(
            "restarting the Spark Connect server: it holds %d Python daemons (Spark never "
            "stops them) and no client is attached",
            held,
        )
        stop_server(home)
        conf = session_conf()
        try:
            return start_server(home, conf, host=state.host, port=state.port)
        except ServerError:  # the port is not free again yet: any port will do for Sluice
            return start_server(home, conf, host=state.host)


ServerStatus = Literal["running", "starting", "stopped", "stale"]


def server_status(home: Path) -> tuple[ServerStatus, ServerState | None]:
    """`running` (alive, accepting), `starting` (alive, not accepting yet), `stale` (a state
    file whose server died), `stopped`."""
    state = ServerState.read(state_path(home))  # StateFileDamaged says what to do
    if state is None:
        return "stopped", None
    if not is_server(state, home):
        return "stale", state
    return ("running" if accepts(state.host, state.port) else "starting"), state
