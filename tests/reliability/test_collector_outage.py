"""The store unreachable for a while: sampling goes on into the buffer, and afterwards the
stream holds every sample, in order (or, with `when_full = "shed"`, every sample not shed,
in order, with the shed ones counted)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from collectors.settings import load_settings
from tests.collectors.conftest import REPO, RunningService, read_payloads, toml_text, wait_for
from tests.disks import small_disk

pytestmark = pytest.mark.slow

STREAM = "lab/outage"
WORKER = Path(__file__).with_name("collector_worker.py")


def write(tmp_path: Path, store: str, **table: object) -> Path:
    base = {"driver": "generator", "stream": STREAM, "samples_per_event": 100}
    path = tmp_path / "collector.toml"
    collector = {"store": store, "state_dir": str(tmp_path / "state"), "drain_timeout_seconds": 3}
    path.write_text(toml_text(collector, {"gen": base | table}))
    return path


def sequences(store_dir: Path) -> list[int]:
    return [s for p in read_payloads(store_dir, STREAM) for s in p["Sequence"]]


def buffer_of(tmp_path: Path) -> Buffer:
    return Buffer(tmp_path / "state" / "gen.db", 10)


def test_store_directory_unavailable_then_back(tmp_path):
    blocked = tmp_path / "mnt"
    blocked.write_text("the store's disk is not mounted")  # a file where a directory should be
    store_dir = blocked / "streams"
    path = write(tmp_path, f"embedded:{store_dir}", samples_per_sec=5_000, max_samples=25_000)
    running = RunningService(load_settings(path, {}, "unused", tmp_path))
    # 2 s of samples buffered; a generous timeout, as the Spark kill suites run beside this
    # test in `make test` (they once slowed it past 30 s).
    wait_for(lambda: buffer_of(tmp_path).depth() >= 100, timeout=90)
    state = buffer_of(tmp_path)
    assert state.meta()["sender_state"].startswith("retrying: StoreUnavailable")
    (message,) = state.conn.execute("SELECT message FROM errors ORDER BY id LIMIT 1").fetchone()
    assert f"stream store embedded:{store_dir} is unavailable" in message
    blocked.unlink()  # the disk is back
    assert running.wait(timeout=120) == 0
    assert sequences(store_dir) == list(range(25_000))
    assert buffer_of(tmp_path).depth() == 0


@pytest.mark.parametrize("when_full", ["block", "shed"])
def test_a_full_buffer_during_an_outage_blocks_or_sheds_and_counts(tmp_path, when_full):
    blocked = tmp_path / "mnt"
    blocked.write_text("unavailable")
    store_dir = blocked / "streams"
    path = write(
        tmp_path,
        f"embedded:{store_dir}",
        samples_per_sec=5_000,
        max_samples=20_000,
        capacity_events=10,
        when_full=when_full,
    )
    running = RunningService(load_settings(path, {}, "unused", tmp_path))
    time.sleep(2.5)  # 12 500 samples due, room for 1 000
    assert buffer_of(tmp_path).depth() == 10
    blocked.unlink()
    assert running.wait(timeout=120) == 0
    got = sequences(store_dir)
    counters = buffer_of(tmp_path).counters()
    assert got == sorted(got) and len(set(got)) == len(got)  # in order, no duplicates
    if when_full == "block":
        assert got == list(range(20_000))
        assert counters["blocked_ms"] >= 1_000 and "samples_shed" not in counters
    else:
        shed = counters["samples_shed"]
        assert shed >= 5_000
        assert len(got) + shed == 20_000  # every sample is either in the stream or counted
        assert counters["samples_committed"] == len(got)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe is closed


def test_pravega_controller_unreachable_then_a_store_to_drain_into(tmp_path):
    uri = f"pravega://127.0.0.1:{closed_port()}"
    path = write(tmp_path, uri, samples_per_sec=10_000, max_samples=20_000)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, str(WORKER), str(path)], env=env, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: buffer_of(tmp_path).depth() >= 200, timeout=60)  # all 20 000 sampled
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0
    log = process.stderr.read()
    assert "nothing listens on 127.0.0.1" in log
    assert "gen: 200 events stay in the buffer and will be sent at the next start" in log
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.cli",
            "collect",
            "--config",
            str(path),
            "status",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    (gen,) = json.loads(status.stdout)
    assert gen["depth_events"] == 200 and gen["counters"]["errors"] >= 1
    assert "is unavailable" in gen["last_errors"][0]["message"]

    store_dir = tmp_path / "streams"
    path = write(tmp_path, f"embedded:{store_dir}", samples_per_sec=10_000, max_samples=20_000)
    assert (
        subprocess.run([sys.executable, str(WORKER), str(path)], env=env, check=False).returncode
        == 0
    )
    assert sequences(store_dir) == list(range(20_000))


def test_a_full_store_disk_keeps_the_collector_buffering_and_status_says_so(tmp_path):
    """The store's disk fills up: the sender's writes fail with StoreFull, sampling goes on
    into the buffer, `sluice collect status` names the full disk, and once space is freed
    every sample lands exactly once, in order."""
    with small_disk(tmp_path / "small-disk", "6m") as disk:
        if disk is None:
            pytest.skip("needs root to mount a small tmpfs for the store's disk")
        with disk.ballast.open("wb") as fh:  # fill the disk to the last byte
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError:
                pass
        store_dir = disk.path / "streams"
        path = write(tmp_path, f"embedded:{store_dir}", samples_per_sec=5_000, max_samples=25_000)
        running = RunningService(load_settings(path, {}, "unused", tmp_path))
        wait_for(lambda: buffer_of(tmp_path).depth() >= 100, timeout=90)
        wait_for(
            lambda: buffer_of(tmp_path).meta()["sender_state"].startswith("retrying: StoreFull"),
            timeout=90,
        )
        status = run_collect_status(path)
        assert "StoreFull" in status, status
        disk.free()
        assert running.wait(timeout=120) == 0
        assert sequences(store_dir) == list(range(25_000))
        assert buffer_of(tmp_path).depth() == 0


def run_collect_status(config: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(config), "status"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
        timeout=60,
    )
    return done.stdout + done.stderr
