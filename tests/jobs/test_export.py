"""`sluice run export`: flattened Parquet/CSV/JSON lines, hive partitions, quarantine, replays."""

from __future__ import annotations

import csv
import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.cli import run as run_command
from pipeline.jobs.export import ExportSpec, export
from pipeline.jobs.runner import RunOptions
from pipeline.streams import StreamStore

pytestmark = pytest.mark.spark

HOUR_NS = 3600 * 10**9
T0 = 1_609_362_000_000_000_000  # 2020-12-30T21:00:00Z


def nic(i: int, n: int, t0: int, **extra) -> bytes:
    event = {
        "TimestampNanos": [t0 + k * 1_000_000 for k in range(n)],
        "RxBytes": [i * 1000 + k for k in range(n)],
        "TxBytes": [k for k in range(n)],
        "RemoteAddr": "ubuntu",
        "Interface": f"eth{i % 2}",
        "LastTimestampFormatted": "2020-12-30T21:29:17.809Z",
    }
    event.update(extra)
    return json.dumps(event).encode()


BAD = [
    b"{not json",
    nic(900, 3, T0, RxBytes=[1, 2]),  # unequal arrays
    nic(901, 2, T0, RxBytes=["1", "2"]),  # wrong type
    json.dumps({"RemoteAddr": "x", "TimestampNanos": [1], "RxBytes": [1], "TxBytes": [1]}).encode(),
    nic(902, 2, T0).replace(b'"ubuntu"', b'"ub\xffuntu"'),  # not UTF-8
]


@dataclass(frozen=True)
class Network:
    store: StreamStore
    store_dir: Path
    samples: int


def sql(query: str) -> list[tuple]:
    return duckdb.connect().execute(query).fetchall()


@pytest.fixture
def network(store, store_dir) -> Network:
    """40 events x 50 samples spread over two event hours, plus one odd name and bad events."""
    store.create_stream("edge/network", segments=2)
    samples = 0
    with store.writer("edge/network") as writer:
        for i in range(40):
            t0 = T0 + (i % 2) * HOUR_NS + i * 10**9
            extra = {"RemoteAddr": 'host, "quoted"'} if i == 7 else {}
            writer.write(nic(i, 50, t0, **extra), routing_key=f"eth{i % 2}")
            samples += 50
        for payload in BAD:
            writer.write(payload, routing_key="bad")
    return Network(store, store_dir, samples)


def run_export(capsys, network: Network, output: Path, *extra: str) -> dict:
    argv = ["--store", f"embedded:{network.store_dir}", "run", "export", "--stream", "edge/network"]
    argv += ["--schema", "NetworkSamples", "--output", str(output), *extra]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def parquet_count(output: Path) -> int:
    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    return sql(f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning=true)")[0][0]


def test_export_to_parquet_csv_and_json_lines(spark, network, tmp_path, capsys):
    out = tmp_path / "out"
    summary = run_export(
        capsys, network, out, "--format", "parquet,csv,jsonl", "--max-events", "15",
        "--max-rows-per-file", "300",
    )  # fmt: skip
    assert (summary["events"], summary["rows"], summary["quarantined"]) == (45, network.samples, 5)
    assert summary["batches"] >= 3

    glob = f"{out}/parquet/date=*/hour=*/*.parquet"
    [(total, distinct)] = sql(
        f"SELECT count(*), count(DISTINCT (_segment, _offset, _sample)) "
        f"FROM read_parquet('{glob}', hive_partitioning=true)"
    )
    assert total == distinct == network.samples
    hours = sql(
        f"SELECT date, hour, count(*) FROM read_parquet('{glob}', hive_partitioning=true) "
        "GROUP BY ALL ORDER BY ALL"
    )
    assert [(str(d), int(h)) for d, h, _ in hours] == [("2020-12-30", 21), ("2020-12-30", 22)]
    [(mismatched,)] = sql(
        f"SELECT count(*) FROM read_parquet('{glob}', hive_partitioning=true) "
        "WHERE strftime(make_timestamp(TimestampNanos // 1000), '%Y-%m-%d') <> date::VARCHAR "
        "OR hour(make_timestamp(TimestampNanos // 1000)) <> hour::INT"
    )
    assert mismatched == 0
    assert all(pq.read_metadata(p).num_rows <= 300 for p in out.glob("parquet/**/*.parquet"))
    assert all(
        pq.read_metadata(p).row_group(0).column(0).compression == "ZSTD"
        for p in out.glob("parquet/**/*.parquet")
    )

    csv_files = sorted(out.glob("csv/date=*/hour=*/*.csv"))
    rows = [r for f in csv_files for r in csv.DictReader(f.open(newline=""))]
    assert len(rows) == network.samples
    assert set(rows[0]) == {
        "RemoteAddr", "Interface", "TimestampNanos", "RxBytes", "TxBytes",
        "_segment", "_offset", "_sample",
    }  # fmt: skip
    assert sum(r["RemoteAddr"] == 'host, "quoted"' for r in rows) == 50

    lines = [json.loads(line) for f in out.glob("jsonl/**/*.jsonl") for line in f.open()]
    assert len(lines) == network.samples and {"_segment", "_offset", "_sample"} <= set(lines[0])
    assert not (out / "_staging").exists() or not any((out / "_staging").iterdir())


def test_quarantine_table_holds_each_bad_event_with_its_reason(spark, network, tmp_path, capsys):
    out = tmp_path / "out"
    run_export(capsys, network, out)
    quarantine = sql(
        f"SELECT _offset, reason, payload FROM read_parquet('{out}/_quarantine/*.parquet') "
        "ORDER BY _segment, _offset"
    )
    reasons = sorted(r.split(":")[0] for _, r, _ in quarantine)
    assert reasons == sorted(
        ["invalid JSON", "unequal arrays", "wrong type", "missing required field", "not UTF-8"]
    )
    assert sorted(bytes(p) for _, _, p in quarantine) == sorted(BAD)
    events = network.store.read("edge/network")
    positions = {(e.segment, e.offset) for e in events if e.payload in BAD}
    found = sql(f"SELECT _segment, _offset FROM read_parquet('{out}/_quarantine/*.parquet')")
    assert set(found) == positions


def forget_last_commit(checkpoint: Path) -> int:
    commits = checkpoint / "spark" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    return last


def test_a_replayed_batch_publishes_nothing_new(spark, network, tmp_path, capsys):
    out, ck = tmp_path / "out", tmp_path / "ck"
    run_export(capsys, network, out, "--checkpoint", str(ck), "--max-events", "20")
    files = sorted(p.relative_to(out) for p in out.rglob("part-*"))
    forget_last_commit(ck)
    run_export(capsys, network, out, "--checkpoint", str(ck))
    assert sorted(p.relative_to(out) for p in out.rglob("part-*")) == files
    assert parquet_count(out) == network.samples


def test_a_crash_mid_publish_is_finished_by_the_replay(spark, network, tmp_path, capsys):
    out, ck = tmp_path / "out", tmp_path / "ck"
    run_export(capsys, network, out, "--checkpoint", str(ck), "--max-events", "20")
    last = forget_last_commit(ck)
    with sqlite3.connect(ck / "ledger.sqlite") as db:
        plan = json.loads(
            db.execute("SELECT plan FROM batches WHERE batch_id=?", (last,)).fetchone()[0]
        )
        db.execute("UPDATE batches SET state='intent', stats=NULL WHERE batch_id=?", (last,))
    moved = plan["items"][0]  # this file was still in staging when the driver died
    Path(moved["staged"]).parent.mkdir(parents=True, exist_ok=True)
    (out / moved["final"]).rename(moved["staged"])
    assert parquet_count(out) < network.samples or moved["kind"] != "parquet"

    run_export(capsys, network, out, "--checkpoint", str(ck))
    assert (out / moved["final"]).exists()
    assert parquet_count(out) == network.samples


def test_a_disk_that_fills_stops_the_export_in_one_line_and_a_rerun_exports_each_row_once(
    spark, network, small_disk, monkeypatch, capsys
):
    """The audit's full output disk ended with `OSError: [Errno 28] Error writing bytes to
    file`, naming no path. Now one line names the output directory and says to free space;
    after that, a re-run finishes the batch (Spark's, then a small one run in this process,
    which fails without starting Spark) and every sample is in the files once."""
    out = small_disk.path / "out"
    argv = ["--store", f"embedded:{network.store_dir}", "run", "export", "--stream"]
    argv += ["edge/network", "--schema", "NetworkSamples", "--output", str(out)]
    refused = (
        f"sluice: error: export job failed: output directory {out}: no space left on its "
        "filesystem; free space on its filesystem and run again: the export is exactly-once, "
        "so its next run finishes the batch and writes each row once"
    )
    small_disk.fill(leave=16 << 10)  # room for the check before Spark, not for the files
    assert cli.main(argv) == 1
    assert capsys.readouterr().err.splitlines()[-1] == refused
    small_disk.free()
    assert run_export(capsys, network, out)["rows"] == network.samples
    assert parquet_count(out) == network.samples

    with network.store.writer("edge/network") as writer:
        for i in range(40, 50):
            writer.write(nic(i, 50, T0 + i * 10**9), routing_key=f"eth{i % 2}")
    in_process = ["--in-process-bytes", str(1 << 20)]
    monkeypatch.setattr(run_command, "_session", no_spark)
    small_disk.fill(leave=16 << 10)
    assert cli.main([*argv, *in_process]) == 1
    assert capsys.readouterr().err.splitlines()[-1] == refused
    small_disk.free()
    assert run_export(capsys, network, out, *in_process)["reports"][0]["spark"] is False
    assert parquet_count(out) == network.samples + 10 * 50
    lineage = f"{out}/parquet/date=*/hour=*/*.parquet"
    distinct = f"SELECT count(DISTINCT (_segment, _offset, _sample)) FROM read_parquet('{lineage}')"
    assert sql(distinct)[0][0] == network.samples + 10 * 50


def no_spark(task):
    msg = "Spark was started"
    raise AssertionError(msg)


SCHEMA_V2 = {
    "namespace": "io.pravega.flinktools.util",
    "type": "record",
    "name": "NetworkSamples",
    "fields": [
        {"name": "RemoteAddr", "type": "string"},
        {"name": "Interface", "type": "string"},
        {"name": "Site", "type": "string", "default": "unknown"},
        {"name": "TimestampNanos", "type": {"type": "array", "items": "long"}},
        {"name": "RxBytes", "type": {"type": "array", "items": "long"}},
        {"name": "TxBytes", "type": {"type": "array", "items": "long"}},
        {"name": "RxErrors", "type": ["null", {"type": "array", "items": "long"}], "default": None},
    ],
}


def test_schema_evolution_two_versions_in_one_stream(spark, store, store_dir, tmp_path):
    store.create_stream("edge/evolving", segments=1)
    with store.writer("edge/evolving") as writer:
        writer.write(nic(1, 3, T0), routing_key="a")  # written under version 1
        writer.write(nic(2, 3, T0 + 10**9, Site="plant-7", RxErrors=[0, 1, 0]), routing_key="a")
    v2 = tmp_path / "NetworkSamplesV2.avsc"
    v2.write_text(json.dumps(SCHEMA_V2))
    uri = f"embedded:{store_dir}"
    new = export(spark, ExportSpec("edge/evolving", str(v2), tmp_path / "v2", uri), RunOptions())
    old = export(
        spark, ExportSpec("edge/evolving", "NetworkSamples", tmp_path / "v1", uri), RunOptions()
    )
    assert (new.rows, new.quarantined, old.rows, old.quarantined) == (6, 0, 6, 0)
    rows = sql(
        f"SELECT Site, RxErrors FROM read_parquet('{tmp_path}/v2/parquet/**/*.parquet') "
        "ORDER BY _offset, _sample"
    )
    assert rows == [("unknown", None)] * 3 + [("plant-7", 0), ("plant-7", 1), ("plant-7", 0)]
    old_columns = pq.read_schema(next((tmp_path / "v1").glob("parquet/**/*.parquet"))).names
    assert "Site" not in old_columns


def test_continuous_export_publishes_a_new_set_of_files_per_trigger(
    spark, store, store_dir, tmp_path
):
    store.create_stream("edge/live", segments=1)
    stop = threading.Event()

    def produce():
        i = 0
        while not stop.is_set() and i < 40:
            with store.writer("edge/live") as writer:
                writer.write(nic(i, 10, T0 + i * 10**9), routing_key="a")
            i += 1
            time.sleep(0.25)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        run = RunOptions(mode="continuous", trigger_seconds=1.0, stop_after_seconds=12)
        spec = ExportSpec("edge/live", "NetworkSamples", tmp_path / "out", f"embedded:{store_dir}")
        summary = export(spark, spec, run)
    finally:
        stop.set()
        producer.join()
    assert len(summary.batches) >= 2
    batches = {p.name.split("-")[1] for p in (tmp_path / "out").glob("parquet/**/*.parquet")}
    assert len(batches) == len(summary.batches)
    assert parquet_count(tmp_path / "out") == summary.rows


def test_bad_schema_or_format_is_one_line_before_spark_starts(store, store_dir, tmp_path, capsys):
    store.create_stream("edge/network", segments=1)
    base = ["--store", f"embedded:{store_dir}", "run", "export", "--stream", "edge/network"]
    base += ["--output", str(tmp_path / "out")]
    assert cli.main([*base, "--schema", "NoSuchSchema"]) == 1
    err = capsys.readouterr().err
    assert "NetworkSamples" in err and len(err.strip().splitlines()) == 1
    assert cli.main([*base, "--schema", "NetworkSamples", "--format", "parquet,xml"]) == 1
    assert "choose from parquet, csv, jsonl" in capsys.readouterr().err
