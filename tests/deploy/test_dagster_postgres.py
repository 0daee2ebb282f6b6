"""The docker/ deployment's Dagster on a real PostgreSQL server, with its own dagster.yaml.

compose.yaml's Dagster services (the `sluice` code location, the webserver, the daemon) run
here as processes, through the image's entry point (which reads the PostgreSQL password from
its secret file), with the platform containers' environment: each named volume a directory
under the test's tmp dir, each service name loopback, the `postgres` service a throwaway
server (tests/postgres.py) and Spark local, as no Spark cluster runs here. dagster.yaml is
the deployment's with two differences a container does not see: the server's free port for
5432, and the `sluice-home` volume's directory for its mount point.

Through the webserver's GraphQL API the test launches a catch-up run of the mirror and the
exports, turns the edge tail sensor on and lets it launch the next catch-up, and reads the
pools; in PostgreSQL itself it finds the runs, their materializations, the sensor's state,
ticks and cursor and the pools' slots (and no SQLite file in DAGSTER_HOME). Then it restarts
the daemon and the webserver and finds all of it again, the sensor still running on its
stored cursor: its next tick launches nothing, as the edge stream did not move.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.scheduler.instigation import InstigatorState
from dagster_graphql import DagsterGraphQLClient

from assets.keys import EDGE_TAIL_SENSOR, catch_up_job_name, export_key, mirror_key, pool
from pipeline.settings import StreamFamily, load_settings
from tests.assets.conftest import samples, write_events
from tests.deploy.conftest import DeploymentDatabase
from tests.docker.test_compose import DOCKER, command, interpolate
from tests.docker.test_processes import VENV_BIN, as_run_here, free_port, graphql, started, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # two catch-up runs (five Spark steps) on a loaded machine
    pytest.mark.usefixtures("product_defaults"),  # as deployed: small backlogs in process
    # DagsterGraphQLClient calls gql the old way (upstream; harmless)
    pytest.mark.filterwarnings("ignore:Using variable_values:DeprecationWarning"),
]

LOCATION = "sluice"  # docker/workspace.yaml's location_name
REPOSITORY = "__repository__"  # the name Dagster gives a code location's `Definitions`
FAMILY = "network"  # docker/sluice.toml's stream family
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
RUN_SECONDS = 600


# --- the deployment, as a container would see it -----------------------------------------


def container_paths(compose: dict, tmp: Path, secret: Path) -> dict[str, str]:
    """Container path -> its place here: a named volume is a directory under `tmp`, a bind
    mount the file in docker/, the `postgres_password` secret the test's secret file."""
    paths = {"/run/secrets/postgres_password": str(secret)}
    for volume in compose["x-platform-volumes"]:
        source, target = volume.split(":")[:2]
        paths[target] = str(DOCKER / source if source.startswith(".") else tmp / source)
    return paths


def relocate(text: str, paths: dict[str, str]) -> str:
    for target in sorted(paths, key=len, reverse=True):
        text = text.replace(target, paths[target])
    return text


def service_env(
    compose: dict, service: str, paths: dict[str, str], dagster_home: Path
) -> dict[str, str]:
    """`service`'s environment in compose.yaml, here. Without DAGSTER_PG_PASSWORD: the entry
    point reads it from the secret file, as in the image."""
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_PG_PASSWORD"}
    for key, value in compose["services"][service]["environment"].items():
        text = interpolate(value)
        env[key] = "127.0.0.1" if text in compose["services"] else relocate(text, paths)
    env["DAGSTER_HOME"] = str(dagster_home)
    env["SLUICE_SPARK_MASTER"] = "local[1]"  # no Spark cluster here
    env["SLUICE_SPARK_REMOTE"] = "local"  # nor its spark-connect service (test_connect.py)
    env["PYTHONPATH"] = str(DOCKER.parent)
    return env


def write_instance(dagster_home: Path, paths: dict[str, str], port: int) -> dict:
    """docker/dagster.yaml into `dagster_home`, on the server's port and the volumes here."""
    config = yaml.safe_load((DOCKER / "dagster.yaml").read_text())
    config["storage"]["postgres"]["postgres_db"]["port"] = port
    text = relocate(yaml.safe_dump(config, sort_keys=False), paths)
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(text)
    return yaml.safe_load(text)


def write_workspace(tmp: Path, grpc_port: int) -> Path:
    """docker/workspace.yaml, with the code location's service on loopback."""
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    workspace["load_from"][0]["grpc_server"].update(host="127.0.0.1", port=grpc_port)
    path = tmp / "workspace.yaml"
    path.write_text(yaml.safe_dump(workspace))
    return path


@dataclass
class Deployment:
    """The Dagster services of compose.yaml, each started through docker/entrypoint.sh."""

    compose: dict
    tmp: Path
    paths: dict[str, str]
    dagster_home: Path
    workspace: Path
    grpc_port: int
    web_port: int = 0
    procs: dict[str, tuple[subprocess.Popen, Path]] = field(default_factory=dict)
    starts: int = 0

    def start(self, service: str) -> None:
        cmd = command(self.compose["services"][service])
        if service == "sluice-code":
            cmd = as_run_here(cmd, self.grpc_port)
        elif service == "dagster-webserver":
            self.web_port = free_port()
            cmd = as_run_here(cmd, self.web_port, self.workspace)
        else:
            cmd = as_run_here(cmd, workspace=self.workspace)
        self.starts += 1
        log = self.tmp / f"{self.starts}-{service}.log"
        env = service_env(self.compose, service, self.paths, self.dagster_home)
        proc = started(["sh", str(DOCKER / "entrypoint.sh"), *cmd], env, log)
        self.procs[service] = (proc, log)

    def stop(self, service: str) -> None:
        proc, _ = self.procs.pop(service)
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def wait(self, check, what: str, service: str, seconds: float = 180) -> None:
        proc, log = self.procs[service]
        wait_for(check, what, proc, log, seconds)

    def ask(self, query: str) -> dict:
        """The webserver's answer to a GraphQL query (its `data`); errors fail the test."""
        reply = graphql(self.web_port, query)
        assert "errors" not in reply, reply["errors"]
        return reply["data"]

    def client(self) -> DagsterGraphQLClient:
        return DagsterGraphQLClient("127.0.0.1", port_number=self.web_port)


# --- waiting for the services ------------------------------------------------------------


def code_location_healthy(deployment: Deployment) -> bool:
    """compose.yaml's healthcheck of `sluice-code`."""
    health = deployment.compose["services"]["sluice-code"]["healthcheck"]["test"][1:]
    health[health.index("--port") + 1] = str(deployment.grpc_port)
    health[0] = str(VENV_BIN / health[0])
    return subprocess.run(health, capture_output=True, check=False).returncode == 0


LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries {
  name locationOrLoadError { __typename ... on PythonError { message } } } } } }"""

DAEMONS = """{ instance { daemonHealth { allDaemonStatuses {
  daemonType healthy lastHeartbeatTime } } } }"""


def location_loaded(deployment: Deployment) -> bool:
    try:
        entries = deployment.ask(LOCATIONS)["workspaceOrError"]["locationEntries"]
    except OSError:
        return False
    loaded = [(e["name"], e["locationOrLoadError"]["__typename"]) for e in entries]
    return loaded == [(LOCATION, "RepositoryLocation")]


def daemon_beating_since(deployment: Deployment, since: float) -> bool:
    """The sensor and run-queue daemons have written a heartbeat after `since`."""
    statuses = deployment.ask(DAEMONS)["instance"]["daemonHealth"]["allDaemonStatuses"]
    beats = {s["daemonType"]: s["lastHeartbeatTime"] or 0 for s in statuses if s["healthy"]}
    return all(beats.get(d, 0) > since for d in ("SENSOR", "QUEUED_RUN_COORDINATOR"))


def start_webserver_and_daemon(deployment: Deployment) -> None:
    since = time.time()
    deployment.start("dagster-webserver")
    deployment.start("dagster-daemon")
    deployment.wait(
        lambda: location_loaded(deployment), "webserver loads sluice", "dagster-webserver"
    )
    deployment.wait(
        lambda: daemon_beating_since(deployment, since), "daemon heartbeats", "dagster-daemon"
    )


# --- what PostgreSQL holds ---------------------------------------------------------------


def query(db: DeploymentDatabase, text: str, *args: object) -> list[tuple]:
    conn = db.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(text, args)
            return cur.fetchall()
    finally:
        conn.close()


def sensor_row(row: tuple[str]) -> tuple[str, tuple[str, str | None]]:
    """A sensor's name -> its status and cursor, from its row in `instigators`."""
    state = dg.deserialize_value(row[0], InstigatorState)
    return state.instigator_name, (state.status.value, state.instigator_data.cursor)


def stored(db: DeploymentDatabase) -> dict[str, object]:
    """Runs, materializations, sensor state and ticks, as the tables hold them."""
    return {
        "runs": dict(query(db, "SELECT run_id, status FROM runs")),
        "materializations": set(
            query(
                db,
                "SELECT run_id, asset_key FROM event_logs"
                " WHERE dagster_event_type = 'ASSET_MATERIALIZATION'",
            )
        ),
        "sensors": dict(map(sensor_row, query(db, "SELECT instigator_body FROM instigators"))),
        "ticks": {row[0] for row in query(db, "SELECT id FROM job_ticks")},
    }


def failure_report(db: DeploymentDatabase, run_id: str) -> str:
    rows = query(
        db,
        "SELECT event FROM event_logs WHERE run_id = %s"
        " AND dagster_event_type IN ('STEP_FAILURE', 'RUN_FAILURE', 'ENGINE_EVENT')",
        run_id,
    )
    return "\n".join(row[0][:2000] for row in rows)


def wait_for_run(deployment: Deployment, db: DeploymentDatabase, run_id: str) -> None:
    client = deployment.client()
    deployment.wait(
        lambda: client.get_run_status(run_id).value in FINISHED,
        f"run {run_id}",
        "dagster-daemon",
        RUN_SECONDS,
    )
    status = client.get_run_status(run_id).value
    assert status == "SUCCESS", f"run {run_id}: {status}\n{failure_report(db, run_id)}"


def materialized_events(db: DeploymentDatabase, run_id: str, key: dg.AssetKey) -> int:
    """The `events` metadata of `key`'s materialization in `run_id`, from the event log."""
    rows = query(
        db,
        "SELECT event FROM event_logs WHERE run_id = %s AND asset_key = %s"
        " AND dagster_event_type = 'ASSET_MATERIALIZATION'",
        run_id,
        key.to_string(),
    )
    assert len(rows) == 1, rows
    record = dg.deserialize_value(rows[0][0], dg.EventLogEntry)
    return record.asset_materialization.metadata["events"].value


# --- GraphQL -----------------------------------------------------------------------------


def selector(name: str) -> str:
    return (
        f'{{repositoryLocationName: "{LOCATION}", repositoryName: "{REPOSITORY}", '
        f'sensorName: "{name}"}}'
    )


def start_sensor(deployment: Deployment, name: str) -> None:
    mutation = f"""mutation {{ startSensor(sensorSelector: {selector(name)}) {{ __typename
      ... on Sensor {{ sensorState {{ status }} }} ... on PythonError {{ message }} }} }}"""
    reply = deployment.ask(mutation)["startSensor"]
    assert reply.get("sensorState") == {"status": "RUNNING"}, reply


def sensor_state(deployment: Deployment, name: str) -> dict:
    return deployment.ask(
        f"""{{ sensorOrError(sensorSelector: {selector(name)}) {{ __typename ... on Sensor {{
          sensorState {{ status ticks(limit: 50) {{
            tickId status timestamp runIds cursor error {{ message }} }} }} }} }} }}"""
    )["sensorOrError"]["sensorState"]


def ticks_after(deployment: Deployment, name: str, since: float) -> list[dict]:
    """The finished ticks of sensor `name` since `since`."""
    ticks = sensor_state(deployment, name)["ticks"]
    return [t for t in ticks if t["timestamp"] > since and t["status"] != "STARTED"]


POOLS = """{ instance {
  poolConfig { poolGranularity defaultPoolLimit }
  runQueueConfig { maxConcurrentRuns tagConcurrencyLimitsYaml }
  concurrencyLimits { concurrencyKey slotCount limit } } }"""


# --- the test ----------------------------------------------------------------------------


@pytest.fixture
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


@pytest.fixture
def deployment(compose, deployment_database, tmp_path):
    paths = container_paths(compose, tmp_path, deployment_database.password_file)
    home = tmp_path / "dagster-home"
    grpc_port = free_port()
    deployment = Deployment(
        compose, tmp_path, paths, home, write_workspace(tmp_path, grpc_port), grpc_port
    )
    write_instance(home, paths, deployment_database.server.port)
    yield deployment
    for service in list(deployment.procs):
        deployment.stop(service)


def network_family(deployment: Deployment, monkeypatch) -> StreamFamily:
    env = service_env(deployment.compose, "sluice-code", deployment.paths, deployment.dagster_home)
    monkeypatch.setenv("SLUICE_STORE", env["SLUICE_STORE"])  # the edge store: the default one
    settings = load_settings(Path(env["SLUICE_CONFIG"]), env, Path(env["SLUICE_HOME"]))
    return settings.family(FAMILY)


def test_the_deployment_runs_dagster_on_postgres_and_survives_a_restart(
    deployment, deployment_database, monkeypatch
):
    db = deployment_database
    family = network_family(deployment, monkeypatch)
    write_events(family.store_uri, family.stream, samples(3))

    deployment.start("sluice-code")
    deployment.wait(lambda: code_location_healthy(deployment), "code location", "sluice-code")
    start_webserver_and_daemon(deployment)

    # A catch-up run of the mirror and the exports, launched through GraphQL, queued by the
    # webserver and launched by the daemon.
    keys = [mirror_key(family), export_key(family, "parquet"), export_key(family, "csv")]
    job = catch_up_job_name(family)
    first = deployment.client().submit_job_execution(
        job, repository_location_name=LOCATION, repository_name=REPOSITORY, asset_selection=keys
    )
    wait_for_run(deployment, db, first)
    tables = stored(db)
    assert tables["runs"] == {first: "SUCCESS"}
    assert {(first, k.to_string()) for k in keys} <= tables["materializations"]
    assert materialized_events(db, first, mirror_key(family)) == 3
    assert list(deployment.dagster_home.rglob("*.db")) == [], "SQLite storage beside PostgreSQL"

    # The edge stream moves; the tail sensor, turned on, launches the family's catch-up.
    write_events(family.store_uri, family.stream, samples(2, first_event=3))
    start_sensor(deployment, EDGE_TAIL_SENSOR)
    launched: list[dict] = []

    def sensor_launched() -> bool:
        ticks = sensor_state(deployment, EDGE_TAIL_SENSOR)["ticks"]
        launched[:] = [t for t in ticks if t["runIds"] and t["status"] != "STARTED"]
        return bool(launched)

    deployment.wait(sensor_launched, "a sensor tick that launches a run", "dagster-daemon")
    assert [t["status"] for t in launched] == ["SUCCESS"], launched
    [second] = launched[0]["runIds"]
    wait_for_run(deployment, db, second)
    assert materialized_events(db, second, mirror_key(family)) == 2  # from run 1's checkpoint
    assert stored(db)["sensors"] == {EDGE_TAIL_SENSOR: ("RUNNING", launched[0]["cursor"])}

    # The pools: the deployment's limits, and a slot per pool the steps ran in.
    config = yaml.safe_load((DOCKER / "dagster.yaml").read_text())["concurrency"]
    instance = deployment.ask(POOLS)["instance"]
    assert instance["poolConfig"] == {
        "poolGranularity": config["pools"]["granularity"],
        "defaultPoolLimit": config["pools"]["default_limit"],
    }
    assert instance["runQueueConfig"]["maxConcurrentRuns"] == config["runs"]["max_concurrent_runs"]
    assert (
        yaml.safe_load(instance["runQueueConfig"]["tagConcurrencyLimitsYaml"])
        == (config["runs"]["tag_concurrency_limits"])
    )
    expected_pools = {pool(j, family) for j in ("mirror", "export", "bookmark")}
    slots = {p["concurrencyKey"]: p["slotCount"] for p in instance["concurrencyLimits"]}
    limit = config["pools"]["default_limit"]
    assert slots == dict.fromkeys(expected_pools, limit)
    in_postgres = query(
        db, "SELECT concurrency_key, count(*) FROM concurrency_slots WHERE NOT deleted GROUP BY 1"
    )
    assert dict(in_postgres) == dict.fromkeys(expected_pools, limit)

    # Restart the daemon and the webserver: nothing is lost, the sensor goes on from its cursor.
    before = stored(db)
    deployment.stop("dagster-daemon")
    deployment.stop("dagster-webserver")
    restarted = time.time()
    start_webserver_and_daemon(deployment)
    after = stored(db)
    assert after["runs"] == before["runs"] == {first: "SUCCESS", second: "SUCCESS"}
    assert after["materializations"] == before["materializations"]
    assert after["sensors"] == before["sensors"]
    assert before["ticks"] <= after["ticks"]
    runs = deployment.ask("{ runsOrError { ... on Runs { results { runId status } } } }")
    assert {r["runId"]: r["status"] for r in runs["runsOrError"]["results"]} == after["runs"]

    deployment.wait(
        lambda: bool(ticks_after(deployment, EDGE_TAIL_SENSOR, restarted)),
        "a sensor tick after the restart",
        "dagster-daemon",
    )
    [tick] = ticks_after(deployment, EDGE_TAIL_SENSOR, restarted)
    assert (tick["status"], tick["runIds"], tick["cursor"]) == (
        "SKIPPED",
        [],
        launched[0]["cursor"],
    )
    assert stored(db)["runs"] == after["runs"]
