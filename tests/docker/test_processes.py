"""Every command of the docker/ images, run here as a process.

No Docker engine runs here, but the processes the containers run do: the entry point scripts
(with a real secret file), and the Dagster trio of compose.yaml, started with the services'
own arguments (only `0.0.0.0` becomes `127.0.0.1`, the ports become free ones and the
instance is a quick SQLite one; tests/deploy runs them on PostgreSQL): the code location answers
its health check (the compose healthcheck command), the webserver loads the `sluice`
location through docker/workspace.yaml's gRPC entry, and the daemon heartbeats.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.docker.test_compose import DOCKER, ROOT, command

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- entry point scripts -----------------------------------------------------------------


def run_script(script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`sh docker/<script> args...` with only PATH and `env` in its environment."""
    return subprocess.run(
        ["sh", str(DOCKER / script), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_entrypoint_reads_the_postgres_secret_into_the_environment(tmp_path):
    secret = tmp_path / "postgres_password"
    secret.write_text("pg-secret-value")
    out = run_script("entrypoint.sh", "env", DAGSTER_PG_PASSWORD_FILE=str(secret))
    assert out.returncode == 0, out.stderr
    assert "DAGSTER_PG_PASSWORD=pg-secret-value" in out.stdout.splitlines()
    assert out.stderr == ""


@pytest.mark.parametrize(("group_read", "umask"), [("", "0077"), ("0", "0077"), ("1", "0027")])
def test_entrypoint_makes_files_owner_only_unless_group_read(group_read, umask):
    out = run_script("entrypoint.sh", "sh", "-c", "umask", SLUICE_GROUP_READ=group_read)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == umask


def test_entrypoint_refuses_an_unreadable_secret(tmp_path):
    out = run_script("entrypoint.sh", "env", DAGSTER_PG_PASSWORD_FILE=str(tmp_path / "missing"))
    assert out.returncode == 64
    assert "DAGSTER_PG_PASSWORD_FILE" in out.stderr
    assert "DAGSTER_PG_PASSWORD=" not in out.stdout


def test_pravega_entrypoint_needs_the_internal_secret_when_auth_is_on():
    out = run_script("pravega-entrypoint.sh", "standalone", PRAVEGA_AUTH="true", JAVA_OPTS="-D=1")
    assert out.returncode == 64
    assert "pravega_internal_password" in out.stderr


# --- the Dagster services ----------------------------------------------------------------


def started(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(check, what: str, proc: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}:\n{log.read_text()}")
        if check():
            return
        time.sleep(1)
    pytest.fail(f"{what}: not ready after {seconds} s:\n{log.read_text()[-3000:]}")


def as_run_here(
    cmd: list[str], port: int | None = None, workspace: Path | None = None
) -> list[str]:
    """The service's command with a loopback host, a free port and a local workspace."""
    swap = {"0.0.0.0": "127.0.0.1", "/opt/sluice": str(ROOT)}
    out = [swap.get(w, w) for w in cmd]
    if port is not None:
        out[out.index("--port") + 1] = str(port)
    if workspace is not None:
        out[out.index("--workspace") + 1] = str(workspace)
    return [str(VENV_BIN / out[0]), *out[1:]]


def graphql(port: int, query: str) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.load(reply)


@pytest.mark.timeout(600)
def test_code_location_webserver_and_daemon_run(tmp_path):
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    svc = compose["services"]
    home = tmp_path / "dagster-home"
    home.mkdir()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SLUICE_HOME": str(tmp_path / "sluice-home"),
        "PYTHONPATH": str(ROOT),
    }
    grpc_port, web_port = free_port(), free_port()
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    workspace["load_from"][0]["grpc_server"].update(host="127.0.0.1", port=grpc_port)
    local_workspace = tmp_path / "workspace.yaml"
    local_workspace.write_text(yaml.safe_dump(workspace))
    procs = []
    try:
        code_log = tmp_path / "code.log"
        code = started(as_run_here(command(svc["sluice-code"]), grpc_port), env, code_log)
        procs.append(code)
        health = svc["sluice-code"]["healthcheck"]["test"][1:]
        health[health.index("--port") + 1] = str(grpc_port)
        health[0] = str(VENV_BIN / health[0])
        wait_for(
            lambda: (
                subprocess.run(health, env=env, capture_output=True, check=False).returncode == 0
            ),
            "code location health check",
            code,
            code_log,
        )
        web_log = tmp_path / "web.log"
        web_cmd = as_run_here(command(svc["dagster-webserver"]), web_port, local_workspace)
        web = started(web_cmd, env, web_log)
        procs.append(web)
        daemon_log = tmp_path / "daemon.log"
        daemon_cmd = as_run_here(command(svc["dagster-daemon"]), workspace=local_workspace)
        daemon = started(daemon_cmd, env, daemon_log)
        procs.append(daemon)

        query = "{ workspaceOrError { ... on Workspace { locationEntries { name "
        query += "locationOrLoadError { __typename } } } } }"

        def location_loaded() -> bool:
            try:
                entries = graphql(web_port, query)["data"]["workspaceOrError"]["locationEntries"]
            except OSError:
                return False
            return [(e["name"], e["locationOrLoadError"]["__typename"]) for e in entries] == [
                ("sluice", "RepositoryLocation")
            ]

        wait_for(location_loaded, "webserver loads the sluice location", web, web_log)
        liveness = [str(VENV_BIN / "dagster-daemon"), "liveness-check"]
        wait_for(
            lambda: (
                subprocess.run(liveness, env=env, capture_output=True, check=False).returncode == 0
            ),
            "daemon heartbeat",
            daemon,
            daemon_log,
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
