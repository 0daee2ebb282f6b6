"""A throwaway PostgreSQL server for the tests: Debian's `postgresql` package (`make
system-deps` installs it), a cluster made by `initdb` in a temporary directory, started by
`pg_ctl` on a free loopback port, stopped and removed afterwards.

PostgreSQL refuses to run as root, so as root the cluster belongs to the package's `postgres`
user. Every connection authenticates with a password (scram-sha-256), as in the compose
deployment's `postgres` service. Its settings trade durability for speed (`fsync=off`): the
server is a test's storage, never data anyone keeps.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from psycopg2 import sql

from tests.docker.test_processes import free_port

#: Where Debian installs each major version's server programs (not on PATH).
DEBIAN_ROOT = Path("/usr/lib/postgresql")
SUPERUSER = "postgres"
START_ATTEMPTS = 3  # a free port may be taken between choosing it and the server binding it


def postgres_bin() -> Path | None:
    """The directory of the newest installed `initdb` and `pg_ctl`, or None."""
    versions = sorted(
        (p.parent for p in DEBIAN_ROOT.glob("*/bin/initdb")),
        key=lambda bin_dir: int(bin_dir.parent.name) if bin_dir.parent.name.isdigit() else 0,
    )
    if versions:
        return versions[-1]
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


MISSING = (
    "PostgreSQL is not installed (no initdb under /usr/lib/postgresql/*/bin or on PATH): "
    "`make system-deps` installs it as root (apt-get install postgresql)"
)


@dataclass(frozen=True, slots=True)
class PostgresServer:
    """A running server on `host:port`, with a superuser that logs in by password."""

    host: str
    port: int
    password: str
    log: Path

    def connect(self, dbname: str = "postgres", user: str = SUPERUSER, password: str = ""):
        """A psycopg2 connection (autocommit) as `user` (the superuser by default)."""
        conn = psycopg2.connect(
            host=self.host,
            port=self.port,
            dbname=dbname,
            user=user,
            password=password or self.password,
            connect_timeout=10,
        )
        conn.autocommit = True
        return conn

    def create_database(self, name: str, owner: str, password: str) -> None:
        """A login role `owner` with `password`, and database `name` that it owns (what the
        `postgres` image makes from POSTGRES_DB, POSTGRES_USER and the password secret)."""
        role, db = sql.Identifier(owner), sql.Identifier(name)
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD %s").format(role), [password])
                cur.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(db, role))
        finally:
            conn.close()


class _Cluster:
    """`initdb` and `pg_ctl` on one data directory, run as an unprivileged user."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self.bin_dir = bin_dir
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.owner = pwd.getpwnam(SUPERUSER) if os.geteuid() == 0 else None

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess:
        owner = self.owner
        return subprocess.run(
            [str(self.bin_dir / program), *args],
            cwd=self.root,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
            capture_output=True,
            text=True,
            check=False,
        )

    def init(self, password: str) -> None:
        if self.owner is not None:
            os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        pwfile = self.root / "superuser-password"
        pwfile.write_text(password)
        if self.owner is not None:
            os.chown(pwfile, self.owner.pw_uid, self.owner.pw_gid)
        out = self.run(
            "initdb",
            *("-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}"),
            *("--auth=scram-sha-256", "--encoding=UTF8", "--no-locale", "--no-sync"),
        )
        pwfile.unlink()
        if out.returncode != 0:
            msg = f"initdb failed ({out.returncode}):\n{out.stdout}{out.stderr}"
            raise RuntimeError(msg)

    def start(self, port: int) -> bool:
        """Whether the server came up on 127.0.0.1:`port` (False: it did not; see the log)."""
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": str(self.root),
            "fsync": "off",
        }
        flags = " ".join(f"-c {k}={v}" for k, v in options.items())
        out = self.run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w",
                       "-t", "60", "-o", flags)  # fmt: skip
        return out.returncode == 0

    def stop(self) -> None:
        out = self.run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w", "-t", "60")
        if out.returncode != 0:
            self.run("pg_ctl", "stop", "-D", str(self.data), "-m", "immediate", "-w")


@contextmanager
def throwaway_server() -> Iterator[PostgresServer]:
    """A fresh cluster on a free loopback port, for as long as the block runs; its files are
    removed afterwards. Raises RuntimeError, with the server's log, when it does not start."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise RuntimeError(MISSING)
    password = os.urandom(32).hex()
    root = Path(tempfile.mkdtemp(prefix="sluice-postgres-"))
    cluster = _Cluster(bin_dir, root)
    started = False
    try:
        cluster.init(password)
        for _ in range(START_ATTEMPTS):
            port = free_port()
            if cluster.start(port):
                started = True
                break
        if not started:
            log = cluster.log.read_text() if cluster.log.exists() else "(no log)"
            msg = f"PostgreSQL did not start in {START_ATTEMPTS} attempts:\n{log[-3000:]}"
            raise RuntimeError(msg)
        yield PostgresServer("127.0.0.1", port, password, cluster.log)
    finally:
        if started:
            cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
