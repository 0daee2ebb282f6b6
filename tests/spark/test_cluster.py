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
import subprocess
import sys
from collections.abc import Iterator

import duckdb
import pytest

from tests.spark.killing import ROOT
from tests.spark.standalone import standalone_cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def cluster(tmp_path) -> Iterator[tuple[str, str]]:
    """A standalone master and one 2-core worker; yields (master URL, master status URL)."""
    with standalone_cluster(tmp_path / "cluster", workers=1, cores_per_worker=2) as running:
        yield running.master, running.status_url


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
