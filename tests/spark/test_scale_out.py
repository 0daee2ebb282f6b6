"""The export and a replay on a standalone cluster of a master and two workers:
the one setting that switches a job to a cluster is SLUICE_SPARK_MASTER."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import pytest

from pipeline.spark.standalone import standalone_cluster, wait_for
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload
from tests.spark.killing import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.spark]


def sluice(store_dir, home, master, *args):
    env = {
        **os.environ,
        "SLUICE_SPARK_MASTER": master,
        "SLUICE_HOME": str(home),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("SLUICE_CONFIG", None)
    argv = [sys.executable, "-m", "pipeline.cli", "--store", f"embedded:{store_dir}", *args]
    done = subprocess.run(argv, env=env, cwd=home, capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done.stdout.decode()


def test_export_and_replay_on_master_and_two_workers(store, store_dir, tmp_path):
    store.create_stream(STREAM, segments=2)
    samples, counted = 0, {"edge1": 0, "edge2": 0}
    for k in range(40):
        for host in ("edge1", "edge2"):
            rates = [2000 + 10 * k] * 50
            t0 = T0 + k * 1000 * MS
            txn = store.begin_transaction(STREAM)
            txn.write(nic_payload(host, t0, counted[host], rates), routing_key=host)
            txn.commit(time_bounds=(t0, t0 + 49 * MS))
            counted[host] += sum(rates)
            samples += len(rates)
    home = tmp_path / "home"
    home.mkdir()
    with standalone_cluster(tmp_path / "cluster", workers=2) as cluster:
        out = tmp_path / "out"
        summary = json.loads(
            sluice(
                store_dir, home, cluster.master, "run", "export", "--stream", STREAM,
                "--schema", "NetworkSamples", "--output", str(out), "--max-events", "20",
            )
        )  # fmt: skip
        assert (summary["events"], summary["rows"]) == (80, samples)
        glob = f"{out}/parquet/date=*/hour=*/*.parquet"
        counted = duckdb.connect().sql(
            f"SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) FROM '{glob}'"
        )
        assert counted.fetchall() == [(samples, samples)]

        start = "2026-11-01T10:00:10Z"
        end = "2026-11-01T10:00:20Z"
        created = json.loads(
            sluice(store_dir, home, cluster.master, "slices", "create", STREAM,
                   "--from", start, "--to", end, "--sensor", "edge1")
        )  # fmt: skip
        replayed = json.loads(
            sluice(
                store_dir, home, cluster.master, "replay", created["slice_id"],
                "--model", "pipeline.models.nic:throughput", "--schema", "NetworkSamples",
                "--output", str(tmp_path / "replay"),
            )
        )  # fmt: skip
        assert replayed["input_events"] == 20, "both sensors' events of those 10 s are in the cuts"
        assert replayed["input_rows"] == 10 * 50, "the rows are edge1's samples of those 10 s"
        # the export and the replay ran as cluster applications, each on both 1-core workers
        state = wait_for(cluster.status_url, lambda s: len(s.get("completedapps", [])) >= 2)
        assert [(a["name"], a["cores"]) for a in state["completedapps"]] == [("sluice", 2)] * 2
