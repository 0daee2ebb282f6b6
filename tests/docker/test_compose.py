"""The docker/ deployment, checked here without a Docker engine.

The compose file must parse and name only what exists: Dockerfiles and the files they copy,
mounted files, secrets made by init-secrets.sh, ports that the commands listen on, environment
variables that something reads, and commands that this project installs. Configuration files
are loaded with the project's own loaders and Dagster's instance schema; the entry point
scripts and the Dagster commands are run as processes (test_processes.py).
"""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
VENV_BIN = Path(sys.executable).parent
SERVICES = {
    "pravega",
    "postgres",
    "sluice-code",
    "dagster-webserver",
    "dagster-daemon",
    "spark-master",
    "spark-connect",
    "spark-worker",
    "collector",
}
# Variables read by the third-party images of compose.yaml, not by Sluice.
IMAGE_VARIABLES = {
    "pravega": {"HOST_IP", "JAVA_OPTS"},  # pravega/pravega's entrypoint.sh
    "postgres": {"POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD_FILE"},
}
_VAR = re.compile(r"\$\{([A-Z0-9_]+)(?::-([^}]*))?\}")


def interpolate(value: object, env: Mapping[str, str] | None = None) -> str:
    """`value` with `${VAR:-default}` replaced as compose does (env, else the default)."""
    env = env or {}
    return _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), str(value))


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def services(compose: dict) -> dict[str, dict]:
    return compose["services"]


def dockerfile_instruction(dockerfile: Path, name: str) -> list[str]:
    """The JSON (exec) form of a Dockerfile instruction (ENTRYPOINT, CMD), joined lines."""
    text = dockerfile.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith(f"{name} ["):
            return json.loads(line.removeprefix(name).strip())
    return []


def entrypoint(service: dict) -> list[str]:
    """What runs before the service's command: compose's entry point, else its image's, with
    tini (PID 1) and the platform image's secret-reading wrapper left out."""
    if "entrypoint" in service:
        return list(service["entrypoint"])
    if "build" not in service:
        return []
    parts = dockerfile_instruction(dockerfile_of(service["build"])[1], "ENTRYPOINT")
    if parts[:2] == ["tini", "--"]:
        parts = parts[2:]
    return [p for p in parts if p != "sluice-entrypoint"]


def command(service: dict) -> list[str]:
    parts = [*entrypoint(service), *service.get("command", [])]
    return [interpolate(p) for p in parts]


def option(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


# --- structure, images, Dockerfiles ------------------------------------------------------


def test_compose_has_the_full_deployment(compose):
    assert set(services(compose)) == SERVICES
    assert "version" not in compose, "the version key is obsolete in the compose spec"
    for name, service in services(compose).items():
        assert "image" in service or "build" in service, name
        assert service.get("restart") == "unless-stopped", name


def dockerfile_of(build: dict) -> tuple[Path, Path]:
    context = (DOCKER / build["context"]).resolve()
    return context, context / build["dockerfile"]


def copy_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def test_builds_name_dockerfiles_whose_sources_exist(compose):
    builds = [s["build"] for s in services(compose).values() if "build" in s]
    assert {Path(b["dockerfile"]).name for b in builds} == {
        "platform.Dockerfile",
        "collector.Dockerfile",
    }
    for build in builds:
        context, dockerfile = dockerfile_of(build)
        assert context == ROOT
        if dockerfile.name == "collector.Dockerfile" and not dockerfile.exists():
            continue  # its own test below says it is missing
        assert dockerfile.is_file(), f"{dockerfile} is missing"
        for source in copy_sources(dockerfile):
            assert (context / source).exists(), f"{dockerfile.name} copies {source}: not found"


def test_the_built_images_keep_tini_as_pid_1(compose):
    """An `entrypoint:` in compose would replace the image's `tini --`: signals would reach
    `sluice` as PID 1 (which ignores what it does not handle) and zombies would stay."""
    for name, service in services(compose).items():
        if "build" in service:
            assert "entrypoint" not in service, name
            dockerfile = dockerfile_of(service["build"])[1]
            assert dockerfile_instruction(dockerfile, "ENTRYPOINT")[:2] == ["tini", "--"], name
    assert command(services(compose)["collector"])[:2] == ["sluice", "collect"]


def test_the_collector_health_check_is_the_status_check(compose):
    from pipeline.cli import build_parser

    check = services(compose)["collector"]["healthcheck"]["test"]
    assert check[0] == "CMD"
    args = build_parser("collect").parse_args(check[2:])
    assert (args.command, args.collect_action, args.check) == ("collect", "status", True)
    assert option(check, "--config") == option(command(services(compose)["collector"]), "--config")
    (healthcheck,) = [
        line
        for line in (DOCKER / "collector.Dockerfile").read_text().replace("\\\n", " ").splitlines()
        if line.startswith("HEALTHCHECK ")
    ]
    assert json.loads(healthcheck.partition(" CMD ")[2]) == check[1:]  # the image's own, too


def test_the_systemd_unit_makes_the_collectors_files_owner_only():
    unit = (DOCKER / "sluice-collector.service").read_text().splitlines()
    assert "UMask=0077" in unit and "StateDirectoryMode=0700" in unit


def test_every_platform_service_runs_the_built_image(compose):
    built = services(compose)["sluice-code"]["image"]
    for name in ("dagster-webserver", "dagster-daemon", "spark-master", "spark-worker"):
        assert services(compose)[name]["image"] == built, name


def test_dockerignore_admits_what_the_platform_image_copies():
    ignore = (DOCKER / "platform.Dockerfile.dockerignore").read_text().splitlines()
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore, "the context is denied by default, then admitted file by file"
    for source in copy_sources(DOCKER / "platform.Dockerfile"):
        assert source.rstrip("/") in admitted, f"{source} is copied but ignored"


def uv_sync_extras(dockerfile: Path) -> list[set[str]]:
    text = dockerfile.read_text().replace("\\\n", " ")
    return [
        set(re.findall(r"--extra[ =](\S+)", line)) for line in re.findall(r"uv sync[^\n]*", text)
    ]


def test_platform_image_extras_are_declared_and_locked():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    lock = (ROOT / "uv.lock").read_text()
    for used in uv_sync_extras(DOCKER / "platform.Dockerfile"):
        assert used and used <= set(extras), f"unknown extra in {used}"
    assert any("dagster-postgres" in d for d in extras["deploy"]), "Dagster's PostgreSQL storage"
    assert 'name = "dagster-postgres"' in lock
    assert "--frozen" in (DOCKER / "platform.Dockerfile").read_text()


def test_collector_image_installs_only_the_edge_extra():
    dockerfile = DOCKER / "collector.Dockerfile"
    assert dockerfile.is_file(), "docker/collector.Dockerfile is written by the collectors work"
    syncs = uv_sync_extras(dockerfile)
    assert syncs, "the collector image installs the project with uv sync"
    assert all(extras == {"edge"} for extras in syncs), syncs
    assert "--frozen" in dockerfile.read_text()


# --- ports ------------------------------------------------------------------------------


def published(compose: dict, env: Mapping[str, str] | None = None) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for name, service in services(compose).items():
        for entry in service.get("ports", []):
            host_ip, host_port, container_port = interpolate(entry, env).split(":")
            out.setdefault(name, []).append((host_ip, int(host_port), int(container_port)))
    return out


def test_nothing_is_published_beyond_loopback_by_default(compose):
    ports = published(compose)
    assert set(ports) == {"pravega", "dagster-webserver", "spark-master"}
    assert all(ip == "127.0.0.1" for entries in ports.values() for ip, _, _ in entries)
    widened = published(compose, {"SLUICE_BIND_ADDRESS": "0.0.0.0"})
    assert widened["dagster-webserver"][0][0] == "127.0.0.1", "the UI has its own switch"
    assert widened["pravega"][0][0] == "0.0.0.0"
    ui = published(compose, {"DAGSTER_UI_BIND_ADDRESS": "10.1.2.3"})["dagster-webserver"]
    assert ui == [("10.1.2.3", 3000, 3000)]


def test_ports_are_the_ones_the_commands_listen_on(compose):
    svc = services(compose)
    ports = published(compose)
    web = command(svc["dagster-webserver"])
    assert ports["dagster-webserver"][0][2] == int(option(web, "--port"))
    master = command(svc["spark-master"])
    assert ports["spark-master"][0][2] == int(option(master, "--webui-port"))
    master_url = f"spark://{option(master, '--host')}:{option(master, '--port')}"
    assert command(svc["spark-worker"])[-1] == master_url
    assert svc["sluice-code"]["environment"]["SLUICE_SPARK_MASTER"] == master_url
    toml = tomllib.loads((DOCKER / "sluice.toml").read_text())
    assert toml["spark"]["master"] == master_url
    code = command(svc["sluice-code"])
    workspace = yaml.safe_load((DOCKER / "workspace.yaml").read_text())
    grpc = workspace["load_from"][0]["grpc_server"]
    assert (grpc["host"], grpc["port"]) == ("sluice-code", int(option(code, "--port")))
    assert (
        grpc["location_name"]
        == yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"][0]["python_module"][
            "location_name"
        ]
    )
    assert {p[2] for p in ports["pravega"]} == {9090, 12345}


# --- files, volumes, secrets -------------------------------------------------------------


def test_mounted_files_exist(compose):
    for name, service in services(compose).items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name} mounts {source}: not found"
            else:
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
    for name, secret in compose["secrets"].items():
        assert interpolate(secret["file"]).startswith("./secrets/"), name


def test_init_secrets_makes_every_secret_file_private_and_stable(compose, tmp_path):
    copy = tmp_path / "docker"
    copy.mkdir()
    (copy / "init-secrets.sh").write_bytes((DOCKER / "init-secrets.sh").read_bytes())
    subprocess.run(["sh", str(copy / "init-secrets.sh")], check=True, capture_output=True)
    first = {}
    for name, secret in compose["secrets"].items():
        path = copy / interpolate(secret["file"])
        assert path.is_file(), f"init-secrets.sh does not make the {name} secret"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        first[name] = path.read_text()
        assert re.fullmatch(r"[0-9a-f]{64}", first[name]), "32 random bytes, hex"
    assert len(set(first.values())) == len(first)
    subprocess.run(["sh", str(copy / "init-secrets.sh")], check=True, capture_output=True)
    assert all(
        (copy / interpolate(s["file"])).read_text() == first[n]
        for n, s in compose["secrets"].items()
    ), "re-running must not change a password"
    assert "*" in (DOCKER / "secrets" / ".gitignore").read_text().splitlines(), "never committed"


def test_services_get_only_the_secrets_that_exist(compose):
    for name, service in services(compose).items():
        for secret in service.get("secrets", []):
            assert secret in compose["secrets"], f"{name} uses an undeclared secret {secret}"


# --- environment --------------------------------------------------------------------------


def project_text() -> str:
    parts = []
    for folder in ("pipeline", "collectors", "assets", "resources"):
        parts += [p.read_text() for p in (ROOT / folder).rglob("*.py")]
    parts += [(DOCKER / f).read_text() for f in ("entrypoint.sh", "pravega-entrypoint.sh")]
    return "\n".join(parts)


def test_environment_variables_are_ones_something_reads(compose):
    source = project_text()
    dagster_yaml = (DOCKER / "dagster.yaml").read_text()
    stores = tomllib.loads((DOCKER / "sluice.toml").read_text())["stores"]
    for name, service in services(compose).items():
        for key in service.get("environment", {}):
            if key in IMAGE_VARIABLES.get(name, set()):
                continue
            if key.startswith("SLUICE_STORE_"):  # SLUICE_STORE_<NAME> of pipeline/settings.py
                assert key.removeprefix("SLUICE_STORE_").lower() in stores, key
                continue
            if key == "DAGSTER_HOME":
                continue  # Dagster's own: where dagster.yaml is
            read = key in source or f"env: {key}" in dagster_yaml
            assert read, f"{name} sets {key}, which nothing reads"


def test_every_knob_is_documented():
    readme = (DOCKER / "README.md").read_text()
    knobs = set(_VAR.findall((DOCKER / "compose.yaml").read_text()))
    assert knobs
    for knob, _default in knobs:
        assert f"`{knob}`" in readme, f"{knob} is not described in docker/README.md"


def test_pravega_keeps_transactions_for_weeks_offline(compose):
    opts = interpolate(services(compose)["pravega"]["environment"]["JAVA_OPTS"]).split()
    props = dict(o[2:].split("=", 1) for o in opts if o.startswith("-D"))
    # the Pravega Sensor Collector's standalone settings: 30 days without renewal
    assert props["controller.transaction.lease.count.max"] == "2592000000"
    assert int(props["controller.transaction.lease.count.max"]) == 30 * 24 * 3600 * 1000
    assert props["controller.transaction.execution.timeBound.days"] == "30"
    assert props["singlenode.security.tls.enable"] == "false"
    assert props["singlenode.security.auth.enable"] == "false"
    assert not any("pwd=" in o for o in opts), "the internal password comes from a secret"
    on = interpolate(
        services(compose)["pravega"]["environment"]["JAVA_OPTS"],
        {"PRAVEGA_TLS": "true", "PRAVEGA_AUTH": "true"},
    )
    assert "singlenode.security.tls.enable=true" in on
    assert "singlenode.security.auth.enable=true" in on
    for path in re.findall(r"location=(\S+)", on):
        assert path.startswith("/etc/pravega/security/"), path


def test_the_cloud_store_switch_reaches_the_pravega_adapter(compose):
    from pipeline.streams.pravega import PravegaSettings

    env = services(compose)["sluice-code"]["environment"]
    assert interpolate(env["SLUICE_STORE_CLOUD"]).startswith("embedded:/var/lib/sluice/cloud")
    uri = interpolate(env["SLUICE_STORE_CLOUD"], {"SLUICE_CLOUD_STORE": "pravega://pravega:9090"})
    settings = PravegaSettings.from_uri(uri, {})
    assert (settings.host, settings.port) == ("pravega", 9090)


# --- configuration loaded by the real loaders -------------------------------------------


def test_dagster_yaml_is_a_valid_instance_with_sluices_concurrency(compose, monkeypatch):
    from dagster._core.instance.config import dagster_instance_config

    from assets.instance import instance_config

    env = services(compose)["dagster-daemon"]["environment"]
    for key in ("DAGSTER_PG_HOST", "DAGSTER_PG_DB", "DAGSTER_PG_USER"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", "from-the-secret-file")
    config, custom_class = dagster_instance_config(str(DOCKER))
    assert custom_class is None
    assert "postgres" in config["storage"]
    loaded = yaml.safe_load((DOCKER / "dagster.yaml").read_text())
    assert loaded["concurrency"] == instance_config()["concurrency"]
    assert loaded["storage"]["postgres"]["postgres_db"]["password"] == {
        "env": "DAGSTER_PG_PASSWORD"
    }


def test_sluice_toml_loads_with_the_compose_environment(compose, monkeypatch):
    from pipeline.settings import load_settings

    env = {k: interpolate(v) for k, v in services(compose)["sluice-code"]["environment"].items()}
    monkeypatch.setenv("SLUICE_STORE", env["SLUICE_STORE"])  # the default store is read there
    settings = load_settings(DOCKER / "sluice.toml", env, Path(env["SLUICE_HOME"]))
    family = settings.family("network")
    assert family.store_uri == env["SLUICE_STORE"]
    assert family.mirror_store_uri == env["SLUICE_STORE_CLOUD"]
    collector_cfg = tomllib.loads((DOCKER / "collector.toml").read_text())
    assert family.stream == collector_cfg["instances"]["net1"]["stream"]


def test_collector_toml_loads_with_the_collectors_loader(compose):
    from collectors.settings import load_settings

    service = services(compose)["collector"]
    cmd = command(service)
    assert cmd[:2] == ["sluice", "collect"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    path = DOCKER / mounted[option(cmd, "--config")]
    env = service["environment"]
    config = load_settings(path, {}, env["SLUICE_STORE"], Path(env["SLUICE_HOME"]))
    assert [i.name for i in config.instances] == ["net1"]
    assert str(config.state_dir) in mounted, "the SQLite buffers live on a volume"


# --- commands --------------------------------------------------------------------------


def test_service_commands_are_installed_here(compose):
    for name, service in services(compose).items():
        cmd = command(service)
        if not cmd or cmd[0].startswith("/"):
            continue  # the Pravega image's own entry point (via docker/pravega-entrypoint.sh)
        assert (VENV_BIN / cmd[0]).exists(), f"{name}: {cmd[0]} is not installed by this project"


def test_sluice_collect_parses_as_the_service_runs_it(compose):
    from pipeline.cli import build_parser

    cmd = command(services(compose)["collector"])
    args = build_parser().parse_args(cmd[1:])
    assert args.command == "collect"
    assert args.func.__module__ == "pipeline.cli.collect"


@pytest.mark.parametrize("name", ["sluice-code", "dagster-webserver", "dagster-daemon"])
def test_dagster_commands_accept_the_services_options(compose, name):
    cmd = command(services(compose)[name])
    words = [w for w in cmd if not w.startswith("-")]
    subcommand = [w for w in words[1:3] if w in ("api", "grpc", "run")]
    help_text = subprocess.run(
        [str(VENV_BIN / cmd[0]), *subcommand, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for flag in (w for w in cmd if w.startswith("--")):
        assert flag in help_text, f"{name}: {flag} is not an option of {' '.join(cmd[:3])}"


def test_spark_commands_name_classes_that_pyspark_ships(compose):
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    core = next(jars.glob("spark-core_*.jar"))
    names = set(zipfile.ZipFile(core).namelist())
    for name in ("spark-master", "spark-worker"):
        cmd = command(services(compose)[name])
        assert cmd[0] == "spark-class"
        assert cmd[1].replace(".", "/") + ".class" in names, cmd[1]
