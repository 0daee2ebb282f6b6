"""A generator collector SIGKILLed over a hundred times at random points, restarted each time:
afterwards every sequence number is in the stream exactly once, in order.

Kills come two ways: a timer (anywhere at all), and failpoints (`collectors/failpoints.py`)
that make the process SIGKILL itself at a chosen step of the protocol, among them inside the
SQLite transaction that records a flushed stream transaction, and between that transaction
and the stream commit. Every failpoint is used at least once per run. Set SLUICE_TEST_SEED to
replay a run.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from tests.collectors.conftest import REPO, read_payloads, toml_text

pytestmark = pytest.mark.slow

KILLS = 110
WORKER = Path(__file__).with_name("collector_worker.py")
POINTS = (
    "buffer.in_append_txn",  # inside the driver's SQLite commit
    "driver.after_append",
    "sender.before_begin",
    "sender.after_record_open",
    "sender.mid_write",
    "sender.after_flush",
    "sender.in_ready_txn",  # inside the SQLite transaction of the two-phase commit
    "sender.after_ready",  # between it and the stream commit
    "sender.after_stream_commit",
    "sender.in_forget_txn",
    "sender.after_forget",
)
STREAM = "lab/kill"


def write_config(tmp_path: Path, max_samples: int | None) -> Path:
    table = {
        "driver": "generator",
        "stream": STREAM,
        "samples_per_sec": 20_000,
        "samples_per_event": 100,
        "max_events_per_txn": 8,
    }
    if max_samples is not None:
        table["max_samples"] = max_samples
    path = tmp_path / "collector.toml"
    collector = {
        "store": f"embedded:{tmp_path / 'streams'}",
        "state_dir": str(tmp_path / "state"),
        "drain_timeout_seconds": 60,
    }
    path.write_text(toml_text(collector, {"gen": table}))
    return path


def start(config: Path, failpoint: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SLUICE_COLLECTOR_FAILPOINTS", None)
    if failpoint:
        env["SLUICE_COLLECTOR_FAILPOINTS"] = failpoint
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def schedule(rng: random.Random) -> list[str | None]:
    """Each failpoint once (hit 1-3), then a random mix of failpoints and timer kills."""
    first = [f"{p}:{rng.randint(1, 3)}" for p in rng.sample(POINTS, len(POINTS))]
    rest = [
        f"{rng.choice(POINTS)}:{rng.randint(1, 4)}" if rng.random() < 0.5 else None
        for _ in range(KILLS - len(first))
    ]
    return first + rest


def test_generator_killed_at_random_points_keeps_every_sample_once_in_order(tmp_path):
    seed = int(os.environ.get("SLUICE_TEST_SEED") or time.time_ns() % 2**32)
    rng = random.Random(seed)
    config = write_config(tmp_path, max_samples=None)
    fired: Counter[str] = Counter()
    kills = 0
    for failpoint in schedule(rng):
        process = start(config, failpoint)
        try:
            # a failpoint fires by itself; a timer kill (or a failpoint not reached) comes later
            process.wait(timeout=4.0 if failpoint else rng.uniform(0.05, 0.9))
        except subprocess.TimeoutExpired:
            process.kill()
        code = process.wait()
        stderr = process.stderr.read()
        assert code == -9, f"seed {seed}: exit {code} under {failpoint}: {stderr}"
        kills += 1
        if failpoint and f"failpoint {failpoint.split(':')[0]}: SIGKILL" in stderr:
            fired[failpoint.split(":")[0]] += 1
    assert kills >= 100
    missing = [p for p in POINTS if not fired[p]]
    assert not missing, f"seed {seed}: failpoints never reached: {missing}"

    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    generated = buffer.cursor("generator").value["next_seq"]
    buffer.close()
    total = generated + 1_000
    final = start(write_config(tmp_path, max_samples=total), None)
    assert final.wait(timeout=180) == 0, final.stderr.read()

    payloads = read_payloads(tmp_path / "streams", STREAM)
    sequences = [s for p in payloads for s in p["Sequence"]]
    duplicates = [s for s, n in Counter(sequences).items() if n > 1][:10]
    assert not duplicates, f"seed {seed}: duplicated {duplicates}"
    assert sequences == list(range(total)), f"seed {seed}: gaps or reordering"
    assert all(p["Value"] == [s * 37 % 1000 for s in p["Sequence"]] for p in payloads)
    state = Buffer(tmp_path / "state" / "gen.db", 10)
    assert state.depth() == 0 and state.txns() == []
    print(json.dumps({"seed": seed, "kills": kills, "failpoints": dict(fired), "samples": total}))
