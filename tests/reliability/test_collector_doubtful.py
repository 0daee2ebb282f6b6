"""Doubtful events, made for real and settled by `sluice collect resolve`.

A collector is killed by a failpoint with a transaction recorded in its buffer, and the
store then forgets that transaction: replaced by a new store (the events are not in the
stream), or by a copy of its streams made after the transaction committed (they are). The
next run keeps the batch doubtful and says so on shutdown; `resolve` reads the stream, tells
which case it is, and `--auto` drops or resends the batch so that every sample is in the
stream once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from pipeline.streams import open_store
from pipeline.wording import agreeing, counted
from tests.collectors.conftest import (
    REPO,
    collect_status,
    read_payloads,
    run_cli,
    running_collector,
    toml_text,
    wait_for,
)

pytestmark = pytest.mark.slow  # collectors killed and restarted, a store repaired

STREAM = "lab/doubtful"
SAMPLES = 4_000
WORKER = Path(__file__).with_name("collector_worker.py")


def write_config(tmp_path: Path, protocol: str, max_samples: int | None = SAMPLES) -> Path:
    instance = {
        "driver": "generator",
        "stream": STREAM,
        "samples_per_event": 10,
        "samples_per_sec": 4_000,
        "max_events_per_txn": 20,
        "txn_protocol": protocol,
    }
    if max_samples is not None:
        instance["max_samples"] = max_samples
    collector = {
        "store": f"embedded:{tmp_path / 'store'}",
        "state_dir": str(tmp_path / "state"),
        "drain_timeout_seconds": 5,
    }
    path = tmp_path / "collector.toml"
    path.write_text(toml_text(collector, {"gen": instance}))
    return path


def run_worker(config: Path, failpoint: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SLUICE_COLLECTOR_FAILPOINTS", None)
    if failpoint:
        env["SLUICE_COLLECTOR_FAILPOINTS"] = failpoint
    return subprocess.run(
        [sys.executable, str(WORKER), str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def resolve(config: Path, *options: str) -> subprocess.CompletedProcess:
    return run_cli("collect", "--config", str(config), "resolve", "gen", *options)


def sequences(tmp_path: Path) -> list[int]:
    return [s for p in read_payloads(tmp_path / "store", STREAM) for s in p["Sequence"]]


def doubtful_samples(tmp_path: Path) -> list[int]:
    """The sample numbers in the buffer's doubtful rows."""
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    try:
        rows = [e for r in buffer.ledger.doubtful() for e in buffer.ledger.rows(r)]
    finally:
        buffer.close()
    return [s for e in rows for s in json.loads(e.payload)["Sequence"]]


def held(tmp_path: Path) -> tuple[int, int]:
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    try:
        found = buffer.held()
        return found.pending, found.doubtful
    finally:
        buffer.close()


def test_a_batch_the_new_store_never_had_is_reported_and_resent(tmp_path):
    config = write_config(tmp_path, "flush")
    killed = run_worker(config, "sender.after_ready:3")  # batch 3 flushed, marked ready
    assert killed.returncode == -9, killed.stderr
    shutil.rmtree(tmp_path / "store")  # the store is replaced: it never heard of batch 3

    finished = run_worker(config)
    assert finished.returncode == 0, finished.stderr
    lost = doubtful_samples(tmp_path)  # batch 3's
    n = len(lost) // 10
    log = finished.stderr
    stay = agreeing(n, "stays", "stay")  # a batch may hold one event
    doubtful = f"gen: {counted(n, 'doubtful event')} {stay} in the buffer and will NOT be sent"
    assert f"{doubtful} until you say so" in log
    assert "run `sluice collect resolve gen`" in log
    assert "in the buffer and will be sent at the next start" not in log
    assert held(tmp_path) == (0, n)
    status = run_cli("collect", "--config", str(config), "status")
    assert f"DOUBTFUL: {counted(n, 'event')} of 1 transaction" in status.stdout, status.stdout
    assert collect_status(config)["gen"]["doubtful_events"] == n

    report = resolve(config)
    assert report.returncode == 0, report.stderr
    none = "its event is not" if n == 1 else f"none of its {n} events is"
    assert f"not in the stream: {none} in lab/doubtful" in report.stdout
    assert "--auto would resend them" in report.stdout
    assert held(tmp_path) == (0, n)  # a report changes nothing

    settled = resolve(config, "--auto")
    assert settled.returncode == 0, settled.stderr
    assert "go to the tail of the send queue" in settled.stdout
    assert held(tmp_path) == (n, 0)
    assert run_worker(config).returncode == 0  # the generator is done: this run only sends
    # Batches 1-2 went to the store that was replaced; batch 3 comes last, once.
    after = list(range(lost[-1] + 1, SAMPLES))
    assert sequences(tmp_path) == after + lost
    assert lost == list(range(lost[0], lost[-1] + 1))
    assert held(tmp_path) == (0, 0)
    assert resolve(config).stdout.strip() == "gen: no doubtful events"


def copy_store(old: Path, new: Path) -> None:
    """A new store with a copy of the stream's events (as a restore or a move would make): it
    never issued the transactions that wrote them."""
    with open_store(f"embedded:{old}") as source, open_store(f"embedded:{new}") as target:
        target.create_stream(STREAM, segments=len(source.info(STREAM).segments))
        with target.writer(STREAM) as writer:
            for event in source.read(STREAM):
                writer.write(event.payload, event.routing_key)


def test_a_batch_the_copied_store_holds_is_found_and_dropped(tmp_path):
    config = write_config(tmp_path, "commit")
    killed = run_worker(config, "sender.after_stream_commit:3")  # committed, still recorded
    assert killed.returncode == -9, killed.stderr
    store_dir = tmp_path / "store"
    store_dir.rename(tmp_path / "old-store")
    copy_store(tmp_path / "old-store", store_dir)

    finished = run_worker(config)
    assert finished.returncode == 0, finished.stderr
    assert "does not know transaction" in finished.stderr
    (pending, doubtful) = held(tmp_path)
    assert pending == 0 and doubtful > 0

    report = resolve(config)
    which = "its event is" if doubtful == 1 else f"all {doubtful} events are"
    assert f"in the stream: {which} in lab/doubtful" in report.stdout
    assert "--auto would drop them" in report.stdout
    settled = resolve(config, "--auto")
    assert settled.returncode == 0, settled.stderr
    assert "dropped its" in settled.stdout
    assert held(tmp_path) == (0, 0)
    assert sequences(tmp_path) == list(range(SAMPLES))  # once each, in order


def test_resolve_refuses_while_the_collector_runs(tmp_path):
    config = write_config(tmp_path, "auto", max_samples=None)
    with running_collector(config) as collector:
        wait_for(lambda: collect_status(config)["gen"]["running"], timeout=60)
        refused = resolve(config, "--drop")
        assert collector.poll() is None
    assert refused.returncode == 1
    assert "instance gen: a running collector holds its buffer" in refused.stderr
    assert "stop it first, then run `sluice collect resolve gen` again" in refused.stderr
