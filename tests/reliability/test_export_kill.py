"""SIGKILL the export's driver at random points; DuckDB sees every sample once or not yet.

While the driver is started and killed over and over (new events arriving each life), a
reader queries the published Parquet with DuckDB ten times a second: at every moment the count
of samples must equal the count of distinct (_segment, _offset, _sample), never go down, and
every visible file must be readable. After the last kill the export runs to completion and
DuckDB must count every sample exactly once.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import duckdb
import pytest

from pipeline.streams import open_store
from tests.spark.killing import job_env, kill_loop, run_to_completion, without_batch_limit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KILLS = 20
SAMPLES = 10
T0 = 1_609_362_000_000_000_000
PAUSE = 0.1  # between the watcher's queries


def counts(output: Path) -> tuple[int, int]:
    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = (
        "SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) "
        f"FROM read_parquet('{glob}', hive_partitioning=true)"
    )
    [(total, distinct)] = duckdb.connect().execute(query).fetchall()
    return total, distinct


class Watcher(threading.Thread):
    """Queries the output every `PAUSE` seconds; records anything a reader should never see.

    Not back to back: on two cores a reader that never pauses competes for CPU with the
    drivers it watches; ten queries a second still see every life's files."""

    def __init__(self, output: Path) -> None:
        super().__init__(daemon=True)
        self.output, self.stop, self.problems, self.queries = output, threading.Event(), [], 0
        self.highest = 0

    def run(self) -> None:
        while not self.stop.is_set():
            if not any(self.output.glob("parquet/date=*/hour=*/*.parquet")):
                self.stop.wait(0.2)
                continue
            try:
                total, distinct = counts(self.output)
            except duckdb.IOException as exc:  # a file vanished between glob and read: retry
                if "No files found" not in str(exc):
                    self.problems.append(f"unreadable: {exc}")
                continue
            except duckdb.Error as exc:
                self.problems.append(f"query failed: {exc}")
                continue
            self.queries += 1
            if total != distinct:
                self.problems.append(f"{total - distinct} duplicated samples visible")
            if total < self.highest:
                self.problems.append(f"samples went from {self.highest} to {total}")
            self.highest = max(self.highest, total)
            self.stop.wait(PAUSE)


def test_export_driver_killed_at_random_points(tmp_path):
    seed = int(os.environ.get("SLUICE_CRASH_SEED", "0")) or None
    edge, output = f"embedded:{tmp_path / 'edge'}", tmp_path / "out"
    with open_store(edge) as store:
        store.create_stream("edge/net", segments=2)
    counter = {"next": 0}

    def more_events(life: int) -> None:
        with open_store(edge) as store:
            for _ in range(3):
                with store.writer("edge/net") as writer:
                    for _ in range(10):
                        i = counter["next"]
                        counter["next"] += 1
                        t0 = T0 + i * 10**9
                        event = {
                            "TimestampNanos": [t0 + k * 10**6 for k in range(SAMPLES)],
                            "RxBytes": [i * SAMPLES + k for k in range(SAMPLES)],
                            "TxBytes": [k for k in range(SAMPLES)],
                            "RemoteAddr": f"life-{life}",
                            "Interface": f"eth{i % 3}",
                        }
                        writer.write(json.dumps(event).encode(), routing_key=f"eth{i % 3}")

    argv = [
        "--store", edge, "run", "export", "--stream", "edge/net", "--schema", "NetworkSamples",
        "--output", str(output), "--format", "parquet", "--max-events", "20",
        "--max-rows-per-file", "150", "--checkpoint", str(tmp_path / "ck"),
    ]  # fmt: skip
    env = job_env(tmp_path / "home")
    watcher = Watcher(output)
    watcher.start()
    try:
        killed = kill_loop(argv, env, KILLS, more_events, seed)
        run_to_completion(without_batch_limit(argv), env)
    finally:
        watcher.stop.set()
        watcher.join()

    assert killed >= KILLS
    assert watcher.problems == []
    assert watcher.queries > 0
    assert counts(output) == (counter["next"] * SAMPLES, counter["next"] * SAMPLES)
