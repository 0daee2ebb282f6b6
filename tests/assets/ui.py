"""A real Dagster UI for browser tests: `dagster-webserver` and `dagster-daemon` on loopback,
on an instance under the test's home, driven by Debian's Chromium through Playwright."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from assets.instance import prepare_dagster_home

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = REPO / "test-artifacts"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = f"dagster-webserver exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            raise RuntimeError(msg)
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    msg = f"dagster-webserver did not answer {url} in {timeout}s:\n{log.read_text()[-3000:]}"
    raise TimeoutError(msg)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@contextmanager
def dagster_ui(home: Path, logs: Path, environ: Mapping[str, str] | None = None) -> Iterator[str]:
    """The webserver's base URL while it (and the daemon that launches queued runs and ticks
    the sensors turned on) run; `environ` adds variables (`SLUICE_*` overrides)."""
    dagster_home = prepare_dagster_home(home / "dagster")
    env = {**os.environ, **(environ or {}), "SLUICE_HOME": str(home)}
    env["DAGSTER_HOME"] = str(dagster_home)
    bin_dir = Path(sys.executable).parent
    port = free_port()
    logs.mkdir(parents=True, exist_ok=True)
    commands = {
        "webserver": [str(bin_dir / "dagster-webserver"), "-h", "127.0.0.1", "-p", str(port)],
        "daemon": [str(bin_dir / "dagster-daemon"), "run"],
    }
    procs: list[subprocess.Popen] = []
    try:
        for name, command in commands.items():
            with (logs / f"{name}.log").open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [*command, "-w", "workspace.yaml"],
                        cwd=REPO,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        base = f"http://127.0.0.1:{port}"
        _wait_for(f"{base}/server_info", procs[0], logs / "webserver.log")
        yield base
    finally:
        for proc in procs:
            _stop(proc)
