"""A Spark standalone cluster on loopback: one master and N workers, from pyspark's own scripts.

Used by the scale-out tests and `benchmarks/cluster.py`, and by anyone who wants a local
cluster to try `SLUICE_SPARK_MASTER=spark://…` against. Daemons are started and stopped with
`sbin/spark-daemon.sh` (what `start-master.sh` / `start-worker.sh` wrap), with logs, pids and
work directories under a directory of the caller's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from pipeline.errors import SluiceError

SPARK_HOME = Path(pyspark.__file__).parent
DAEMON = SPARK_HOME / "sbin" / "spark-daemon.sh"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterNotReady(SluiceError):
    def __init__(self, status_url: str, timeout: float, last: object) -> None:
        self.status_url, self.timeout = status_url, timeout
        msg = f"{status_url} not ready after {timeout} s: {last}; see the daemons' logs"
        super().__init__(msg)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def master_state(status_url: str) -> dict:
    with urllib.request.urlopen(status_url, timeout=5) as response:
        return json.load(response)


def wait_for(status_url: str, ready, timeout: float = 120) -> dict:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = master_state(status_url)
            if ready(last):
                return last
        except OSError as exc:
            last = exc
        time.sleep(1)
    raise ClusterNotReady(status_url, timeout, last)


@dataclass(frozen=True)
class Cluster:
    master: str  # spark://127.0.0.1:PORT
    status_url: str  # the master's JSON status


@contextmanager
def standalone_cluster(
    workdir: Path, workers: int = 2, cores_per_worker: int = 1, memory: str = "2g"
) -> Iterator[Cluster]:
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOG_DIR": str(workdir / "spark-logs"),
        "SPARK_PID_DIR": str(workdir / "spark-pids"),
        "SPARK_WORKER_DIR": str(workdir / "spark-work"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_IDENT_STRING": f"sluice-{os.getpid()}-{workdir.name}",
    }
    port, ui = free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    daemon = ["bash", str(DAEMON)]
    master_args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
    subprocess.run([*daemon, "start", MASTER_CLASS, "1", *master_args], env=env, check=True)
    started = 0
    try:
        for n in range(1, workers + 1):
            args = ["--host", "127.0.0.1", "--cores", str(cores_per_worker), "--memory", memory]
            args += ["--webui-port", str(free_port()), master]
            subprocess.run([*daemon, "start", WORKER_CLASS, str(n), *args], env=env, check=True)
            started = n
        status = f"http://127.0.0.1:{ui}/json/"
        wait_for(status, lambda state: state.get("aliveworkers", 0) >= workers)
        yield Cluster(master, status)
    finally:
        for n in range(1, started + 1):
            subprocess.run([*daemon, "stop", WORKER_CLASS, str(n)], env=env, check=False)
        subprocess.run([*daemon, "stop", MASTER_CLASS, "1"], env=env, check=False)
