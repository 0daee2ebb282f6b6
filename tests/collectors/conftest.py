"""Helpers for collector tests: write a collector.toml, load it, run instances, read streams."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from collectors.settings import CollectorSettings, load_settings
from pipeline.failpoints import Failpoints

REPO = Path(__file__).resolve().parents[2]


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def toml_text(collector: dict, instances: dict[str, dict]) -> str:
    lines = ["[collector]"] + [f"{k} = {toml_value(v)}" for k, v in collector.items()]
    for name, table in instances.items():
        lines += ["", f"[instances.{name}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


@pytest.fixture
def write_config(tmp_path, store_dir) -> Callable[..., Path]:
    """Write a collector.toml with a store and state dir under tmp_path; return its path."""

    def write(instances: dict[str, dict], **collector: object) -> Path:
        collector.setdefault("store", f"embedded:{store_dir}")
        collector.setdefault("state_dir", str(tmp_path / "state"))
        collector.setdefault("drain_timeout_seconds", 20)
        path = tmp_path / "collector.toml"
        path.write_text(toml_text(collector, instances))
        return path

    return write


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    """Two empty directories for the files driver."""
    a, b = tmp_path / "in-a", tmp_path / "in-b"
    a.mkdir()
    b.mkdir()
    return a, b


@pytest.fixture
def make_config(write_config, tmp_path) -> Callable[..., CollectorSettings]:
    def make(
        instances: dict[str, dict], environ: dict | None = None, **collector
    ) -> CollectorSettings:
        path = write_config(instances, **collector)
        return load_settings(path, environ or {}, "embedded:/nowhere", tmp_path / "home")

    return make


class RunningService:
    """`run_service` on a thread of this process, stopped by `stop()`."""

    def __init__(self, config: CollectorSettings, failpoints: Failpoints | None = None) -> None:
        from collectors.service import run_service

        self.stop_event = threading.Event()
        self.result: list[object] = []

        def target() -> None:
            try:
                self.result.append(
                    run_service(
                        config, failpoints or Failpoints(), self.stop_event, install_signals=False
                    )
                )
            except BaseException as exc:
                self.result.append(exc)

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 60.0) -> object:
        self.stop_event.set()
        return self.wait(timeout)

    def wait(self, timeout: float = 60.0) -> object:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the collector did not stop"
        result = self.result[0]
        if isinstance(result, BaseException):
            raise result
        return result


@pytest.fixture
def service() -> Iterator[Callable[..., RunningService]]:
    started: list[RunningService] = []

    def start(config: CollectorSettings, failpoints: Failpoints | None = None) -> RunningService:
        running = RunningService(config, failpoints)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop_event.set()
        running.thread.join(60)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "accelfifo"
    os.mkfifo(path)
    return path


def samplers(root: Path) -> list[int]:
    """The pids of the NIC sampling processes reading counters under `root`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if b"nic_sampler" in cmdline and str(root).encode() in cmdline:
            found.append(int(proc.name))
    return found


def rewrite_counter(path: Path, text: str) -> None:
    """Change a stand-in sysfs counter while a sampler reads it, never empty in between: one
    write over the old text, padded with the white space a counter may have around it.
    (`write_text` truncates first, and a read in that moment found b'': an error the kernel's
    own files never give, as their reads are whole.)"""
    with path.open("r+b") as fh:
        fh.write(text.encode().ljust(path.stat().st_size))


def wait_for(
    condition: Callable[[], bool],
    timeout: float = 60.0,
    explain: Callable[[], str] | None = None,
) -> None:
    """Poll `condition` every 50 ms until it holds; fail the test after `timeout` seconds,
    saying what `explain` returns then (the state that kept the condition from holding)."""
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s" + (f": {explain()}" if explain else ""))
        time.sleep(0.05)


@contextlib.contextmanager
def buffer_at(path: Path, capacity: int = 100) -> Iterator[Buffer]:
    """A buffer opened to look into, closed again on leaving. One left to the garbage
    collector closes whenever a collection runs: if the collector has stopped, its connection
    is the file's last, SQLite deletes the log then, and the next start finds the buffer
    marked open without its log and refuses it as damaged (a flaky test, twice)."""
    buffer = Buffer(path, capacity)
    try:
        yield buffer
    finally:
        buffer.close()


def read_payloads(store_dir: Path, stream: str) -> list[dict]:
    from pipeline.streams import open_store

    with open_store(f"embedded:{store_dir}") as store:
        if not store.stream_exists(stream):
            return []
        return [json.loads(e.payload) for e in store.read(stream)]


def run_cli(
    *args: str,
    env: dict | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    stdin: str = "",
):
    """Run `sluice ...` as a separate process (the way systemd runs it)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or REPO,
        timeout=timeout,
    )


def start_collector(path: Path) -> subprocess.Popen:
    """`sluice collect --config path` as its own process (the way systemd runs it); its
    standard error is kept for the test to read."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(path)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def running_collector(path: Path) -> Iterator[subprocess.Popen]:
    """`start_collector(path)`, killed on the way out unless the test stopped it itself."""
    process = start_collector(path)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def collect_status(path: Path) -> dict[str, dict]:
    """`sluice collect status --json` of the instances of `path`, by instance name."""
    result = run_cli("collect", "--config", str(path), "status", "--json")
    assert result.returncode == 0, result.stderr
    return {report["name"]: report for report in json.loads(result.stdout)}


def free_port() -> int:
    """A loopback TCP port nothing listens on (now)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mosquitto_binary() -> str:
    import shutil

    binary = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/sbin")
    if binary is None:
        pytest.skip("mosquitto is not installed: apt-get install -y mosquitto (make system-deps)")
    return binary


class Broker:
    """A mosquitto process on a free loopback port, with a config written for the test."""

    def __init__(
        self, binary: str, directory: Path, port: int | None = None, persistent: bool = False
    ) -> None:
        self.port = port or free_port()
        conf = directory / "mosquitto.conf"
        # `persistent`: sessions and their unacknowledged messages outlive a restart (saved
        # on a clean stop); `user root` keeps it from dropping to a user that cannot write.
        persistence = (
            f"true\npersistence_location {directory}/\nuser root" if persistent else "false"
        )
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            f"persistence {persistence}\n"
            "max_inflight_messages 50\n"
            "max_queued_messages 100000\n"
        )
        self.log = directory / "mosquitto.log"
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_listening()

    def _wait_listening(self) -> None:
        import time

        from pipeline.spark.connect import accepts  # a probe that never counts self-connects

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if accepts("127.0.0.1", self.port, timeout=0.2):
                return
            time.sleep(0.05)
        msg = f"mosquitto did not listen on {self.port}: {self.log.read_text()}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture
def mosquitto(tmp_path) -> Iterator[Broker]:
    broker = Broker(mosquitto_binary(), tmp_path)
    yield broker
    broker.stop()
