"""SIGKILL the export's driver at random points; DuckDB sees every sample once or not yet.

While the driver is started and killed over and over (new events arriving each life), a
reader looks at the published Parquet twenty times a second and queries it with DuckDB each
time it changed: at every moment the count of samples must equal the count of distinct
(_segment, _offset, _sample), never go down, and every visible file must be readable. After
the last kill the export runs to completion and DuckDB must count every sample exactly once.
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
PAUSE = 0.05  # between the watcher's looks at the published files


def counts(output: Path) -> tuple[int, int]:
    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = (
        "SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) "
        f"FROM read_parquet('{glob}', hive_partitioning=true)"
    )
    [(total, distinct)] = duckdb.connect().execute(query).fetchall()
    return total, distinct


def published(output: Path) -> frozenset[tuple[str, int, int, int]]:
    """The visible Parquet files, each with what changes when it is replaced or rewritten."""
    files = set()
    for path in output.glob("parquet/date=*/hour=*/*.parquet"):
        try:
            stat = path.stat()
        except FileNotFoundError:  # replaced between the listing and the stat: seen next time
            continue
        files.add((str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return frozenset(files)


class Watcher(threading.Thread):
    """Looks at the published files every `PAUSE` seconds and queries them with DuckDB each
    time they changed; records anything a reader should never see.

    A query over the same files (same names, inodes, sizes, times) sees the same bytes, so
    only a change is queried: a query costs about 0.1 s of CPU once a hundred files are out,
    and on two cores a reader querying ten times a second took most of a core from the
    drivers it watches."""

    def __init__(self, output: Path) -> None:
        super().__init__(daemon=True)
        self.output, self.stop, self.problems, self.queries = output, threading.Event(), [], 0
        self.highest = 0

    def run(self) -> None:
        checked: frozenset = frozenset()
        while not self.stop.is_set():
            files = published(self.output)
            if not files or files == checked:
                self.stop.wait(PAUSE)
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
            checked = files  # listed before the query: a change during it is queried next
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
