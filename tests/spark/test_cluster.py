"""The export against a real Spark standalone cluster: a master and a worker on loopback.

Both are started with pyspark's own `sbin/spark-daemon.sh` (the script `start-master.sh`
and `start-worker.sh` wrap), with their logs, pids and work directories under the test's
temporary directory, and stopped the same way. The export runs as `sluice run export` in its
own process with `SLUICE_SPARK_MASTER=spark://127.0.0.1:<port>`: its executors are launched
by the worker, with the driver's interpreter (`spark.pyspark.python`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pyspark
import pytest

from tests.spark.killing import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.spark]

SPARK_HOME = Path(pyspark.__file__).parent
DAEMON = SPARK_HOME / "sbin" / "spark-daemon.sh"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, ready, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                last = json.load(response)
            if ready(last):
                return last
        except OSError as exc:
            last = exc
        time.sleep(1)
    msg = f"{url} not ready after {timeout} s: {last}"
    raise AssertionError(msg)


@pytest.fixture
def cluster(tmp_path) -> Iterator[tuple[str, str]]:
    """A standalone master and one 2-core worker; yields (master URL, master web UI URL)."""
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOG_DIR": str(tmp_path / "spark-logs"),
        "SPARK_PID_DIR": str(tmp_path / "spark-pids"),
        "SPARK_WORKER_DIR": str(tmp_path / "spark-work"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_IDENT_STRING": f"sluice-test-{os.getpid()}",
    }
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master = f"spark://127.0.0.1:{port}"
    daemon = ["bash", str(DAEMON)]
    master_args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)]
    worker_args = ["--host", "127.0.0.1", "--cores", "2", "--memory", "2g"]
    worker_args += ["--webui-port", str(worker_ui), master]
    subprocess.run([*daemon, "start", MASTER_CLASS, "1", *master_args], env=env, check=True)
    try:
        subprocess.run([*daemon, "start", WORKER_CLASS, "1", *worker_args], env=env, check=True)
        try:
            url = f"http://127.0.0.1:{ui}/json/"
            wait_for(url, lambda state: state.get("aliveworkers", 0) >= 1)
            yield master, url
        finally:
            subprocess.run([*daemon, "stop", WORKER_CLASS, "1"], env=env, check=False)
    finally:
        subprocess.run([*daemon, "stop", MASTER_CLASS, "1"], env=env, check=False)


def test_export_runs_on_a_standalone_cluster(cluster, store, store_dir, tmp_path):
    master, status_url = cluster
    store.create_stream("edge/network", segments=2)
    samples = 0
    with store.writer("edge/network") as writer:
        for i in range(30):
            n = 20 + i
            event = {
                "TimestampNanos": [
                    1_609_362_000_000_000_000 + (i * 100 + k) * 10**6 for k in range(n)
                ],
                "RxBytes": list(range(n)),
                "TxBytes": list(range(n)),
                "RemoteAddr": "ubuntu",
                "Interface": f"eth{i % 2}",
            }
            writer.write(json.dumps(event).encode(), routing_key=f"eth{i % 2}")
            samples += n
    output = tmp_path / "out"
    env = {
        **os.environ,
        "SLUICE_SPARK_MASTER": master,
        "SLUICE_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-m", "pipeline.cli", "--store", f"embedded:{store_dir}", "run"]
    argv += ["export", "--stream", "edge/network", "--schema", "NetworkSamples"]
    argv += ["--output", str(output), "--max-events", "10"]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    summary = json.loads(done.stdout)
    assert (summary["events"], summary["rows"], summary["batches"]) == (30, samples, 3)

    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = (
        f"SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) FROM read_parquet('{glob}')"
    )
    assert duckdb.connect().execute(query).fetchall() == [(samples, samples)]
    state = wait_for(status_url, lambda s: len(s.get("completedapps", [])) >= 1, timeout=60)
    assert [app["name"] for app in state["completedapps"]] == ["sluice"]
