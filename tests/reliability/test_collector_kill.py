"""A generator collector SIGKILLed at random points, restarted each time: afterwards every
sequence number is in the stream exactly once, in order. Under each transaction protocol
(`coordinator.py`): the flush protocol over a hundred times, the commit protocol forty.

Kills come two ways: a timer (anywhere at all), and failpoints (`pipeline/failpoints.py`)
that make the process SIGKILL itself at a chosen step of the protocol, among them inside the
SQLite transaction that records a flushed stream transaction (flush) or a begun one with its
batch (commit), and between that and the stream commit. Every failpoint of the protocol is
used at least once per run. Set SLUICE_TEST_SEED to replay a run.
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

WORKER = Path(__file__).with_name("collector_worker.py")
DRIVER_POINTS = (
    "buffer.in_append_txn",  # inside the driver's SQLite commit
    "driver.after_append",
    "sender.before_begin",
)
FORGET_POINTS = ("sender.after_stream_commit", "sender.in_forget_txn", "sender.after_forget")
FLUSH_POINTS = (
    *DRIVER_POINTS,
    "sender.after_record_open",
    "sender.mid_write",
    "sender.after_flush",
    "sender.in_ready_txn",  # inside the SQLite transaction of the two-phase commit
    "sender.after_ready",  # between it and the stream commit
    *FORGET_POINTS,
)
COMMIT_POINTS = (
    *DRIVER_POINTS,
    "sender.in_open_txn",  # inside the SQLite transaction that records the batch
    "sender.after_record_open",
    "sender.mid_write",
    "sender.before_commit",
    *FORGET_POINTS,
)
STREAM = "lab/kill"


def write_config(tmp_path: Path, protocol: str, max_samples: int | None) -> Path:
    table = {
        "driver": "generator",
        "stream": STREAM,
        "samples_per_sec": 20_000,
        "samples_per_event": 100,
        "max_events_per_txn": 8,
        "txn_protocol": protocol,
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


def schedule(rng: random.Random, points: tuple[str, ...], kills: int) -> list[str | None]:
    """Each failpoint once (hit 1-3), then a random mix of failpoints and timer kills."""
    first = [f"{p}:{rng.randint(1, 3)}" for p in rng.sample(points, len(points))]
    rest = [
        f"{rng.choice(points)}:{rng.randint(1, 4)}" if rng.random() < 0.5 else None
        for _ in range(kills - len(first))
    ]
    return first + rest


@pytest.mark.parametrize(
    ("protocol", "points", "planned"),
    [
        pytest.param("flush", FLUSH_POINTS, 110, id="flush"),
        pytest.param("commit", COMMIT_POINTS, 40, id="commit"),
    ],
)
def test_generator_killed_at_random_points_keeps_every_sample_once_in_order(
    tmp_path, protocol, points, planned
):
    seed = int(os.environ.get("SLUICE_TEST_SEED") or time.time_ns() % 2**32)
    rng = random.Random(seed)
    config = write_config(tmp_path, protocol, max_samples=None)
    fired: Counter[str] = Counter()
    kills = 0
    for failpoint in schedule(rng, points, planned):
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
    assert kills == planned
    missing = [p for p in points if not fired[p]]
    assert not missing, f"seed {seed}: failpoints never reached: {missing}"

    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    generated = buffer.cursor("generator").value["next_seq"]
    buffer.close()
    total = generated + 1_000
    final = start(write_config(tmp_path, protocol, max_samples=total), None)
    assert final.wait(timeout=180) == 0, final.stderr.read()

    payloads = read_payloads(tmp_path / "streams", STREAM)
    sequences = [s for p in payloads for s in p["Sequence"]]
    duplicates = [s for s, n in Counter(sequences).items() if n > 1][:10]
    assert not duplicates, f"seed {seed}: duplicated {duplicates}"
    assert sequences == list(range(total)), f"seed {seed}: gaps or reordering"
    assert all(p["Value"] == [s * 37 % 1000 for s in p["Sequence"]] for p in payloads)
    state = Buffer(tmp_path / "state" / "gen.db", 10)
    assert state.depth() == 0 and state.ledger.txns() == []
    assert state.meta()["txn_protocol"] == protocol
    counters = state.counters()
    # both recovery paths ran: a transaction committed again, and one aborted and resent
    assert counters["txns_recommitted"] and counters["txns_aborted"], f"seed {seed}: {counters}"
    report = {"protocol": protocol, "seed": seed, "kills": kills, "samples": total}
    print(json.dumps(report | {"failpoints": dict(fired)}))
