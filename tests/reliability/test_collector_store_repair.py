"""A collector and a store whose catalog is lost and rebuilt by `sluice store repair`.

The collector is killed by a failpoint with a transaction it recorded (flushed, maybe ready to
commit), the store's catalog is deleted and rebuilt from the data files, and the collector
starts again: every sample is in the stream once, in order, and nothing is left doubtful.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from pipeline.streams import open_store
from tests.collectors.conftest import read_payloads, run_cli, toml_text
from tests.reliability.test_collector_doubtful import run_worker

STREAM = "lab/repaired"
SAMPLES = 4_000


def write_config(tmp_path: Path) -> Path:
    instance = {
        "driver": "generator",
        "stream": STREAM,
        "samples_per_event": 10,
        "samples_per_sec": 4_000,
        "max_samples": SAMPLES,
        "max_events_per_txn": 20,
    }
    collector = {
        "store": f"embedded:{tmp_path / 'store'}",
        "state_dir": str(tmp_path / "state"),
        "drain_timeout_seconds": 5,
    }
    path = tmp_path / "collector.toml"
    path.write_text(toml_text(collector, {"gen": instance}))
    return path


def lose_catalog(store_dir: Path) -> None:
    for name in ("catalog.db", "catalog.db-wal", "catalog.db-shm"):
        (store_dir / name).unlink(missing_ok=True)


@pytest.mark.parametrize("failpoint", ["sender.after_ready:3", "sender.after_flush:3"])
def test_a_flushed_transaction_survives_a_catalog_rebuild(tmp_path, failpoint):
    config = write_config(tmp_path)
    store_dir = tmp_path / "store"
    killed = run_worker(config, failpoint)
    assert killed.returncode == -9, killed.stderr
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    (record,) = buffer.ledger.txns()  # flushed: `ready`, or `open` before it was marked
    buffer.close()
    lose_catalog(store_dir)
    repaired = run_cli("--store", f"embedded:{store_dir}", "store", "repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"recovered transaction {record.txn_id} as open" in repaired.stdout

    finished = run_worker(config)
    assert finished.returncode == 0, finished.stderr
    assert "does not know transaction" not in finished.stderr
    sequences = [s for p in read_payloads(store_dir, STREAM) for s in p["Sequence"]]
    assert sequences == list(range(SAMPLES))
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    assert buffer.ledger.txns() == [] and buffer.depth() == 0
    buffer.close()


def test_a_transaction_half_landed_when_the_catalog_was_lost_lands_the_rest(tmp_path):
    """A commit over two segments that landed one block before the catalog was lost: the
    rebuild records it `committing`, and committing it again lands the other block."""
    store_dir = tmp_path / "store"
    uri = f"embedded:{store_dir}"
    with open_store(uri) as store:
        store.create_stream(STREAM, segments=2)
        keys = [f"sensor-{i}" for i in range(16)]
        txn = store.begin_transaction(STREAM)
        for key in keys:
            txn.write(key.encode(), key)
        txn.flush()
        txn_id = txn.txn_id
        bodies = {p.name: p.read_bytes() for p in (store_dir / "txn").glob("*.body")}
        assert len(bodies) == 2
        txn.commit()
    # The crash: segment 1's block never landed, and its flushed body is still in txn/.
    (segment_1,) = (store_dir / "data").rglob("1.seg")
    os.truncate(segment_1, 0)
    (store_dir / "txn" / f"{txn_id}.1.body").write_bytes(bodies[f"{txn_id}.1.body"])
    lose_catalog(store_dir)

    repaired = run_cli("--store", uri, "store", "repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert f"recovered transaction {txn_id} as committing" in repaired.stdout
    with open_store(uri) as store:
        assert store.get_transaction(STREAM, txn_id).state() == "committing"
        store.get_transaction(STREAM, txn_id).commit()
        assert store.get_transaction(STREAM, txn_id).state() == "committed"
        assert sorted(e.payload.decode() for e in store.read(STREAM)) == sorted(keys)
        assert store.verify().ok
