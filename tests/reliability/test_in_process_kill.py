"""SIGKILL small-backlog runs (one batch in the job's own process, no Spark) at random points.

Batch 0 goes through Spark (a new checkpoint is always Spark's). Then each life gets a few
new events, so its run is one in-process batch (`pipeline/jobs/in_process.py`): Spark's
offset log entry, the sink's write and its ledger-backed commit, Spark's commit log entry.
Each life is killed at a random moment from the point where it starts its batch (its
"reading" line) to a little past the time such a batch takes. A kill leaves at most one
batch planned and not committed, which the next life re-runs over its own cuts, again
without Spark: no life after batch 0 may start Spark. After the last kill one more run
finishes what is left; the output must then hold every event exactly once (the export:
DuckDB's count of samples equals the count of distinct positions; the mirror: every payload
once, in the source's order for each routing key).
"""

from __future__ import annotations

import json
import os
import random
import time

import duckdb
import pytest

from pipeline.streams import open_store
from tests.spark.killing import Life, job_env, kill, run_to_completion, start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KILLS = 15
SAMPLES = 10
KEYS = 5
T0 = 1_609_362_000_000_000_000


class Source:
    """The edge stream and what has been written to it."""

    def __init__(self, uri: str) -> None:
        self.uri, self.count = uri, 0
        with open_store(uri) as store:
            store.create_stream("edge/net", segments=2)

    def write(self, life: int, events: int = 12) -> None:
        with open_store(self.uri) as store, store.writer("edge/net") as writer:
            for _ in range(events):
                i, t0 = self.count, T0 + self.count * 10**9
                self.count += 1
                event = {
                    "TimestampNanos": [t0 + k * 10**6 for k in range(SAMPLES)],
                    "RxBytes": [i * SAMPLES + k for k in range(SAMPLES)],
                    "TxBytes": list(range(SAMPLES)),
                    "RemoteAddr": f"life-{life}",
                    "Interface": f"eth{i % KEYS}",
                }
                writer.write(json.dumps(event).encode(), routing_key=f"eth{i % KEYS}")


def wait_for_line(life: Life, text: str, timeout: float) -> float | None:
    """When `text` first appeared on the life's standard error, or None if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in life.stderr):
            return time.monotonic()
        if life.proc.poll() is not None:
            return None
        time.sleep(0.005)
    return None


def killed_then_finished(argv: list[str], env: dict[str, str], source: Source) -> None:
    """Batch 0 through Spark (its standard error says so, as a later life's would), then
    `KILLS` killed in-process lives, then one run to the end, none of which starts Spark."""
    source.write(0)
    first = run_to_completion([*argv, "--in-process-bytes", "0"], env)
    assert any("starting Spark" in line for line in first.stderr), first.tail()
    env = {**env, "SLUICE_IN_PROCESS_BYTES": str(1 << 20)}
    seed = int(os.environ.get("SLUICE_CRASH_SEED", "0")) or None
    assert kill_lives(argv, env, source, seed) >= KILLS
    last = run_to_completion(argv, env)
    assert not any("starting Spark" in line for line in last.stderr), last.tail()


def kill_lives(argv: list[str], env: dict[str, str], source: Source, seed: int | None) -> int:
    """Lives with new events each, killed at random points of their in-process batch, until
    `KILLS` were killed; the lives' standard error must never say Spark started."""
    rng = random.Random(seed)
    batch_seconds, killed, lives = 0.5, 0, 0
    while killed < KILLS:
        source.write(lives)
        life = start(argv, env)
        began = wait_for_line(life, "reading", timeout=60)
        if began is not None:
            deadline = began + rng.uniform(0.0, 1.3 * batch_seconds)
            while time.monotonic() < deadline and life.proc.poll() is None:
                time.sleep(0.002)
        if life.proc.poll() is None:
            kill(life)
            killed += 1
        else:
            assert life.proc.returncode == 0, life.tail()
            if began is not None:  # learn how long a batch takes on this machine
                batch_seconds = 0.5 * batch_seconds + 0.5 * (time.monotonic() - began)
            time.sleep(0.05)  # let the pump thread take the last lines
            assert any("(in this process, no Spark)" in line for line in life.stderr)
        assert not any("starting Spark" in line for line in life.stderr), life.tail()
        lives += 1
        assert lives <= KILLS * 4, f"only {killed} of {lives} lives could be killed"
    return killed


def test_an_export_killed_in_its_in_process_batches_publishes_every_sample_once(tmp_path):
    source, output = Source(f"embedded:{tmp_path / 'edge'}"), tmp_path / "out"
    argv = [
        "--store", source.uri, "run", "export", "--stream", "edge/net",
        "--schema", "NetworkSamples", "--output", str(output), "--format", "parquet",
        "--checkpoint", str(tmp_path / "ck"),
    ]  # fmt: skip
    killed_then_finished(argv, job_env(tmp_path / "home"), source)

    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = f"SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) FROM '{glob}'"
    [(total, distinct)] = duckdb.connect().execute(query).fetchall()
    assert total == distinct == source.count * SAMPLES


@pytest.mark.parametrize("commit_mode", ["tasks", "driver"])
def test_a_mirror_killed_in_its_in_process_batches_copies_every_event_once(tmp_path, commit_mode):
    source, cloud = Source(f"embedded:{tmp_path / 'edge'}"), f"embedded:{tmp_path / 'cloud'}"
    argv = [
        "--store", source.uri, "run", "mirror", "--stream", "edge/net", "--to", "cloud/net",
        "--to-store", cloud, "--commit-mode", commit_mode, "--checkpoint", str(tmp_path / "ck"),
    ]  # fmt: skip
    killed_then_finished(argv, job_env(tmp_path / "home"), source)

    with open_store(source.uri) as edge, open_store(cloud) as target:
        sent = list(edge.read("edge/net"))
        copied = list(target.read("cloud/net"))
    payloads = [e.payload for e in copied]
    assert len(payloads) == len(set(payloads)), "an event was copied twice"
    assert sorted(payloads) == sorted(e.payload for e in sent), "an event is missing"
    for key in {e.routing_key for e in sent}:
        order = [e.payload for e in sent if e.routing_key == key]
        assert [e.payload for e in copied if e.routing_key == key] == order, key
