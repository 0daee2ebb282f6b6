"""`sluice collect` as a process, stopped by SIGTERM, SIGINT and SIGHUP (issue 13): each drains
within `drain_timeout_seconds` whatever the driver is doing (here a generator asked for a
billion samples a second), a second signal ends the drain at once, status tells how the run
ended, and every generated sample is in the stream or the buffer exactly once."""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from pipeline.wording import counted
from tests.collectors.conftest import (
    collect_status,
    read_payloads,
    start_collector,
    toml_text,
    wait_for,
)

STREAM = "lab/signals"


def write_config(tmp_path: Path, store: str, drain: float, **generator: object) -> Path:
    table = {"driver": "generator", "stream": STREAM, "samples_per_event": 1000} | generator
    collector = {"store": store, "state_dir": str(tmp_path / "state")}
    collector["drain_timeout_seconds"] = drain
    path = tmp_path / "collector.toml"
    path.write_text(toml_text(collector, {"gen": table}))
    return path


def buffered_sequences(buffer_file: Path) -> list[int]:
    conn = sqlite3.connect(buffer_file)
    try:
        rows = conn.execute("SELECT payload FROM events ORDER BY id").fetchall()
    finally:
        conn.close()
    return [s for (payload,) in rows for s in json.loads(payload)["Sequence"]]


def next_seq(buffer_file: Path) -> int:
    conn = sqlite3.connect(buffer_file)
    try:
        (cursor,) = conn.execute("SELECT value FROM cursor WHERE name = 'generator'").fetchone()
    finally:
        conn.close()
    return json.loads(cursor)["next_seq"]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_each_stop_signal_drains_in_time_at_an_impossible_rate(tmp_path, store_dir, signum):
    drain = 8.0
    path = write_config(tmp_path, f"embedded:{store_dir}", drain, samples_per_sec=1e9)
    process = start_collector(path)
    wait_for(lambda: len(read_payloads(store_dir, STREAM)) >= 3)
    sent_at = time.monotonic()
    process.send_signal(signum)
    assert process.wait(drain + 20) == 0, process.stderr.read()
    took = time.monotonic() - sent_at
    log = process.stderr.read()
    assert took < drain + 3, log  # the drain time, and the interpreter's exit
    assert f"{signum.name} received: stopping drivers and draining buffers" in log
    assert "did not stop in time" not in log

    buffer_file = tmp_path / "state" / "gen.db"
    stored = [s for p in read_payloads(store_dir, STREAM) for s in p["Sequence"]]
    left = buffered_sequences(buffer_file)
    assert stored + left == list(range(next_seq(buffer_file)))  # each once, in order

    report = collect_status(path)["gen"]
    assert report["running"] is False
    assert (
        report["last_stop"]
        == f"{signum.name} received; {counted(len(left) // 1000, 'event')} left in the buffer"
    )


def test_a_second_signal_ends_the_drain_at_once(tmp_path):
    not_a_directory = tmp_path / "streams"
    not_a_directory.write_text("the store cannot live here")
    path = write_config(
        tmp_path, f"embedded:{not_a_directory}", 120.0, samples_per_sec=2000, max_samples=4000
    )
    process = start_collector(path)
    buffer_file = tmp_path / "state" / "gen.db"
    wait_for(lambda: buffer_file.exists() and collect_status(path)["gen"]["depth_events"] >= 2)
    process.send_signal(signal.SIGTERM)
    time.sleep(2.0)
    assert process.poll() is None  # draining: the sender keeps retrying the store
    sent_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert time.monotonic() - sent_at < 5
    log = process.stderr.read()
    assert "SIGTERM again: ending the drain now; what is buffered stays" in log
    assert buffered_sequences(buffer_file) == list(range(next_seq(buffer_file)))  # kept
    assert not_a_directory.read_text() == "the store cannot live here"
    report = collect_status(path)["gen"]
    assert report["running"] is False and report["depth_events"] >= 2
    assert report["last_stop"].startswith("SIGTERM received; ")


def test_status_after_a_kill_says_the_run_did_not_stop_cleanly(tmp_path, store_dir):
    path = write_config(tmp_path, f"embedded:{store_dir}", 10.0, samples_per_sec=5000)
    process = start_collector(path)
    wait_for(lambda: len(read_payloads(store_dir, STREAM)) >= 2)
    process.kill()
    process.wait(30)
    report = collect_status(path)["gen"]
    assert report["running"] is False and report["healthy"] is False
    assert report["last_stop"].startswith("ended without a clean stop (a crash, a kill")
