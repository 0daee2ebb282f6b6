"""The throwaway PostgreSQL server of the deployment tests: one per test run (per xdist
worker), skipped with the reason only when PostgreSQL is not installed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.docker.test_compose import DOCKER
from tests.postgres import MISSING, PostgresServer, postgres_bin, throwaway_server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    if postgres_bin() is None:
        pytest.skip(MISSING)
    with throwaway_server() as server:
        yield server


@dataclass(frozen=True, slots=True)
class DeploymentDatabase:
    """What compose.yaml's `postgres` service makes: database and owner from its environment
    (POSTGRES_DB, POSTGRES_USER), the password in a secret file (`postgres_password`)."""

    server: PostgresServer
    name: str
    user: str
    password_file: Path

    def connect(self):
        return self.server.connect(self.name, self.user, self.password_file.read_text())


@pytest.fixture(scope="session")
def deployment_database(postgres_server, tmp_path_factory) -> DeploymentDatabase:
    env = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["postgres"]
    name, user = env["environment"]["POSTGRES_DB"], env["environment"]["POSTGRES_USER"]
    secret = tmp_path_factory.mktemp("secrets") / "postgres_password"
    secret.write_text(os.urandom(32).hex())  # as docker/init-secrets.sh makes it
    secret.chmod(0o600)
    postgres_server.create_database(name, user, secret.read_text())
    return DeploymentDatabase(postgres_server, name, user, secret)
