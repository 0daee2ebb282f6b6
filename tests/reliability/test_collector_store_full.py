"""The store's disk fills up while the collector sends (a 8 MiB tmpfs, filled mid-run): the
sender's writes fail with StoreFull, sampling goes on into the buffer, `sluice collect status`
names the full disk, and once space is freed every sample lands exactly once, in order.
(`test_collector_outage.py` fills the disk before the collector starts.)"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from collectors.settings import load_settings
from tests.collectors.conftest import RunningService, read_payloads, run_cli, toml_text, wait_for
from tests.disks import small_disk

pytestmark = pytest.mark.slow

STREAM = "lab/full"
SAMPLES = 40_000


def meta_of(tmp_path: Path) -> dict[str, str]:
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    try:
        return buffer.meta()
    finally:
        buffer.close()


@pytest.mark.parametrize(
    ("protocol", "leave"),
    [("flush", 0), ("flush", 100_000), ("commit", 0), ("commit", 100_000)],
)
def test_the_store_disk_fills_while_sending(tmp_path, protocol, leave):
    with small_disk(tmp_path / "disk", "8m") as disk:
        if disk is None:
            pytest.skip("needs root to mount a small tmpfs for the store's disk")
        store_dir = disk.path / "streams"
        instance = {
            "driver": "generator",
            "stream": STREAM,
            "samples_per_event": 100,
            "samples_per_sec": 5_000,
            "max_samples": SAMPLES,
            "txn_protocol": protocol,
        }
        collector = {
            "store": f"embedded:{store_dir}",
            "state_dir": str(tmp_path / "state"),
            "drain_timeout_seconds": 5,
        }
        path = tmp_path / "collector.toml"
        path.write_text(toml_text(collector, {"gen": instance}))
        running = RunningService(load_settings(path, {}, "unused", tmp_path))
        try:
            wait_for((store_dir / "catalog.db").exists, timeout=60)
            time.sleep(1.0)  # some batches committed
            disk.fill(leave)
            wait_for(
                lambda: meta_of(tmp_path).get("sender_state", "").startswith("retrying: StoreFull"),
                timeout=90,
            )
            status = run_cli("collect", "--config", str(path), "status")
            assert "sender retrying: StoreFull: no space left" in status.stdout, status.stdout
            assert "healthy" in status.stdout
            disk.free()
            assert running.wait(timeout=120) == 0
        finally:  # a failed run must not go on writing beside the next test's collector
            running.stop_event.set()
            running.thread.join(60)
        got = [s for p in read_payloads(store_dir, STREAM) for s in p["Sequence"]]
        assert got == list(range(SAMPLES))
        conn = sqlite3.connect(tmp_path / "state" / "gen.db")
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        conn.close()
