"""Files driver: CSV and Parquet, once each, in name order; growing, empty, bad, vanishing files."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from collectors.buffer import Buffer
from collectors.instance import InstanceContext
from collectors.service import create_driver
from pipeline.failpoints import Failpoints

from .conftest import read_payloads, wait_for


def rows_in(store_dir) -> list[dict]:
    return [row for payload in read_payloads(store_dir, "lab/files") for row in payload]


def csv_file(path: Path, first: int, count: int, header: str = "seq,name,value\n") -> Path:
    lines = [header] + [f"{i},n{i},{i * 0.5}\n" for i in range(first, first + count)]
    path.write_text("".join(lines))
    return path


def settle(path: Path) -> None:
    """Age a file's mtime, as if it was written a while ago."""
    old = time.time_ns() - 60 * 1_000_000_000
    os.utime(path, ns=(old, old))


def files_config(make_config, directories, **extra):
    table = {
        "driver": "files",
        "stream": "lab/files",
        "directories": [str(d) for d in directories],
        "samples_per_event": 4,
        "settle_ms": 300,
        "scan_interval_ms": 50,
    } | extra
    return make_config({"files": table})


def counters(config) -> dict:
    return Buffer(config.instances[0].buffer_file, 10).counters()


def test_csv_files_in_name_order_each_once(make_config, service, store_dir, dirs):
    a, b = dirs
    for path, first in ((b / "02.csv", 10), (a / "01.csv", 0), (a / "03.csv", 20)):
        settle(csv_file(path, first, 10))
    (a / "notes.txt").write_text("not for us")
    settle(csv_file(a / "04.csv.tmp", 99, 1))  # being written under a temporary name
    config = files_config(make_config, dirs)
    running = service(config)
    wait_for(lambda: counters(config).get("files_done", 0) == 3 and len(rows_in(store_dir)) == 30)
    time.sleep(0.5)  # more scans: nothing is taken twice
    running.stop()
    rows = rows_in(store_dir)
    assert [r["seq"] for r in rows] == list(range(30))
    assert rows[3] == {"seq": 3, "name": "n3", "value": 1.5}
    assert len(read_payloads(store_dir, "lab/files")) == 9  # 10 rows in events of 4: 3 per file
    assert (a / "01.csv").exists()  # neither deleted nor moved: remembered instead


def test_completed_files_are_deleted_or_moved(make_config, service, store_dir, dirs, tmp_path):
    a, b = dirs
    settle(csv_file(a / "x.csv", 0, 3))
    settle(csv_file(b / "y.csv", 3, 3))
    config = files_config(make_config, [a], delete_completed=True)
    running = service(config)
    wait_for(lambda: not (a / "x.csv").exists())
    running.stop()
    done = tmp_path / "done"
    config = files_config(make_config, [b], completed_dir=str(done))
    running = service(config)
    wait_for((done / "y.csv").exists)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(6))


def test_a_growing_file_is_taken_once_it_has_settled(make_config, service, store_dir, dirs):
    a, _ = dirs
    path = a / "growing.csv"
    config = files_config(make_config, [a], settle_ms=700)
    running = service(config)
    with path.open("w") as fh:
        fh.write("seq,name,value\n")
        for i in range(12):
            fh.write(f"{i},n{i},{i}\n")
            fh.flush()
            time.sleep(0.15)  # a writer that keeps appending for ~1.8 s
            assert rows_in(store_dir) == []
    wait_for(lambda: len(rows_in(store_dir)) == 12)
    time.sleep(0.5)
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == list(range(12))


def test_empty_and_header_only_files_are_completed_without_events(
    make_config, service, store_dir, dirs
):
    a, _ = dirs
    settle(_touch(a / "00-empty.csv"))
    settle(csv_file(a / "01-header.csv", 0, 0))
    settle(csv_file(a / "02-rows.csv", 0, 2))
    config = files_config(make_config, [a], delete_completed=True)
    running = service(config)
    wait_for(lambda: not any(a.iterdir()))
    running.stop()
    assert [r["seq"] for r in rows_in(store_dir)] == [0, 1]
    assert counters(config)["files_done"] == 3


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("seq,name\n1,a\n2,b,extra\n", "line 3: 3 fields where the header has 2"),
        ('seq,name\n1,"unterminated\n', "unexpected end of data"),
        ("seq,seq\n1,2\n", "line 1: the header repeats a column name"),
        (b"seq,name\n1,\xff\xfe\n", "not UTF-8 text"),
        ("seq,name\n1,a\0b\n", "line 2: a NUL character (a damaged or binary file)"),
    ],
)
def test_a_malformed_csv_goes_to_the_failed_folder_with_its_reason(  # noqa: PLR0917
    make_config, service, store_dir, dirs, tmp_path, content, reason
):
    a, _ = dirs
    bad = a / "01-bad.csv"
    bad.write_bytes(content if isinstance(content, bytes) else content.encode())
    settle(bad)
    settle(csv_file(a / "02-good.csv", 0, 3))
    failed = tmp_path / "failed"
    config = files_config(make_config, [a], failed_dir=str(failed))
    running = service(config)
    wait_for(lambda: (failed / "01-bad.csv").exists() and len(rows_in(store_dir)) == 3)
    running.stop()
    note = (failed / "01-bad.csv.reason.txt").read_text()
    assert reason in note and str(bad) in note
    assert not bad.exists()
    assert [r["seq"] for r in rows_in(store_dir)] == [0, 1, 2]  # nothing of the bad file
    buffer = Buffer(config.instances[0].buffer_file, 10)
    assert buffer.counters()["files_failed"] == 1
    (message,) = buffer.conn.execute("SELECT message FROM errors").fetchone()
    assert reason in message


def test_a_file_that_disappears_before_it_is_read_is_skipped(make_config, dirs, tmp_path):
    a, _ = dirs
    gone = settle_and_return(csv_file(a / "gone.csv", 0, 3))
    config = files_config(make_config, [a])
    inst = config.instances[0]
    driver = create_driver(inst)
    ctx = InstanceContext(inst, Buffer(inst.buffer_file, 100), threading.Event(), Failpoints())
    ctx.buffer.write(lambda c: c.execute(_files_schema()))
    assert driver._candidates() == []  # first seen now: settled once unchanged for settle_ms
    time.sleep(0.4)
    listed = driver._candidates()
    assert listed == [gone]
    gone.unlink()  # deleted between the listing and the read
    driver._process(ctx, gone)
    assert ctx.buffer.depth() == 0
    assert ctx.buffer.counters()["files_vanished"] == 1
    assert not (tmp_path / "state" / "files.failed").exists()


def settle_and_return(path: Path) -> Path:
    settle(path)
    return path


def _files_schema() -> str:
    from collectors.drivers.files import FILES_SCHEMA

    return FILES_SCHEMA


def test_a_file_changed_during_ingestion_is_failed_with_what_was_sent(
    make_config, service, store_dir, dirs, tmp_path
):
    a, _ = dirs
    path = settle_and_return(csv_file(a / "big.csv", 0, 1000))
    failed = tmp_path / "failed"
    config = files_config(make_config, [a], samples_per_event=1, failed_dir=str(failed))
    inst = config.instances[0]
    driver = create_driver(inst)
    ctx = InstanceContext(inst, Buffer(inst.buffer_file, 10_000), threading.Event(), Failpoints())
    ctx.buffer.write(lambda c: c.execute(_files_schema()))
    original_commit = driver._commit
    calls = []

    def commit_then_touch(*args, **kwargs):
        result = original_commit(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            with path.open("a") as fh:
                fh.write("1000,n1000,1\n")  # someone appends while we ingest
        return result

    driver._commit = commit_then_touch
    driver._process(ctx, path)
    note = (failed / "big.csv.reason.txt").read_text()
    assert "changed while it was being ingested (200 earlier rows of it were already sent)" in note
    assert ctx.buffer.depth() == 200  # what was buffered is kept (and will be sent)


def test_parquet_files_with_a_time_column(make_config, service, store_dir, store, dirs):
    a, _ = dirs
    base = 1_700_000_000_000
    table = pa.table(
        {
            "ts": pa.array([base + i for i in range(10)], pa.timestamp("ms", tz="UTC")),
            "temp": [20.0 + i for i in range(10)],
            "site": ["north"] * 10,
            "raw": [bytes([i]) for i in range(10)],
        }
    )
    path = a / "t.parquet"
    pq.write_table(table, path)
    settle(path)
    (a / "broken.parquet").write_bytes(b"PAR1 not really")
    settle(a / "broken.parquet")
    config = files_config(
        make_config,
        [a],
        format="parquet",
        time_column="ts",
        time_unit="iso",
        samples_per_event=5,
        max_events_per_txn=1,  # one event per transaction: time cuts select single events
    )
    running = service(config)
    wait_for(lambda: len(rows_in(store_dir)) == 10)
    running.stop()
    rows = rows_in(store_dir)
    assert rows[0] == {
        "ts": "2023-11-14T22:13:20+00:00",
        "temp": 20.0,
        "site": "north",
        "raw": "AA==",
    }
    start, end = store.time_cuts("lab/files", (base + 5) * 1_000_000, (base + 6) * 1_000_000)
    (event,) = list(store.read("lab/files", start, end))
    assert b'"temp":25.0' in event.payload
    failed = Path(config.instances[0].buffer_file).parent / "files.failed"
    assert "not a readable Parquet file" in (failed / "broken.parquet.reason.txt").read_text()
