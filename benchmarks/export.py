"""Export: NIC events -> flattened Parquet (zstd), Sluice beside DuckDB and Spark's JSON reader.

    .venv/bin/python benchmarks/export.py [--events 10000] [--samples 1000]

The same events become one Parquet row per sample by the export job's code path (`sluice`
source ranges -> `sluice-export` tasks, as one batch), by DuckDB (`read_ndjson`, `unnest`,
`COPY`) and by Spark's own JSON reader (`arrays_zip` + `explode`), on the same cores; Spark
is warmed up first, each contender's best of `--repeat` rounds counts, and every output is
checked to hold events x samples rows first (`benchmarks/README.md`)."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.spark.session import SparkSettings, spark_session
from pipeline.streams import open_store

T0 = 1_609_363_757_807_000_000


def nic_payload(i: int, samples: int) -> bytes:
    """A NIC event as the collector writes it, with realistic counters: timestamps 1 ms apart
    with jitter, byte counters growing by bursts (seeded, so every run has the same data)."""
    rng = np.random.default_rng(i)
    step = np.arange(samples) * 1_000_000
    bursts = rng.random((2, samples)) < 0.3
    event = {
        "TimestampNanos": (
            T0 + i * samples * 1_000_000 + step + rng.integers(0, 5000, samples)
        ).tolist(),
        "RxBytes": (719_763_680 + np.cumsum(rng.integers(0, 1500, samples) * bursts[0])).tolist(),
        "TxBytes": (4_594_274 + np.cumsum(rng.integers(0, 200, samples) * bursts[1])).tolist(),
        "RemoteAddr": "ubuntu",
        "Interface": f"ens{33 + i % 2}",
        "LastTimestampFormatted": "2020-12-30T21:29:17.809Z",
    }
    return json.dumps(event, separators=(",", ":")).encode()


def prepare(root: Path, events: int, samples: int) -> tuple[str, Path, int]:
    """The events in an embedded stream (one transaction per 100 events) and an NDJSON file."""
    uri = f"embedded:{root / 'streams'}"
    ndjson = root / "events.ndjson"
    size = 0
    with open_store(uri) as store, ndjson.open("wb") as out:
        store.create_stream("bench/network", segments=2)
        for start in range(0, events, 100):
            txn = store.begin_transaction("bench/network")
            for i in range(start, min(events, start + 100)):
                payload = nic_payload(i, samples)
                txn.write(payload, f"ens{33 + i % 2}")
                out.write(payload + b"\n")
                size += len(payload)
            txn.commit()
    return uri, ndjson, size


def timed(label: str, run: Callable[[int], int], attempt: int, expected: int) -> float:
    started = time.perf_counter()
    rows = run(attempt)
    seconds = time.perf_counter() - started
    if rows != expected:
        msg = f"{label} wrote {rows} rows, expected {expected}"
        raise SystemExit(msg)
    return seconds


def parquet_rows(pattern: str) -> int:
    query = f"SELECT count(*) FROM read_parquet('{pattern}')"
    return duckdb.connect().execute(query).fetchall()[0][0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__, args.workdir)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="sluice-bench-export-"))
    total = args.events * args.samples

    print(f"preparing {args.events} events x {args.samples} samples = {total:,} samples ...")
    uri, ndjson, size = prepare(root, args.events, args.samples)
    print(f"  {size / 1e6:.0f} MB of JSON, in {root}")

    started = time.perf_counter()
    spark = spark_session(SparkSettings(master="local[2]", app_name="bench-export"))
    startup = time.perf_counter() - started

    def sluice(attempt: int) -> int:
        out = root / f"sluice-{attempt}"
        (
            spark.read.format("sluice")
            .option("store", uri)
            .option("stream", "bench/network")
            .option("minPartitions", "2")
            .option("emit", "ranges")  # as the export job: tasks read their ranges themselves
            .load()
            .write.format("sluice-export")
            .mode("append")
            .option("schema", "NetworkSamples")
            .option("output", str(out))
            .option("formats", "parquet")
            .option("maxRowsPerFile", "5000000")
            .save()
        )
        rows = parquet_rows(f"{out}/parquet/*/*/*.parquet")
        shutil.rmtree(out)
        return rows

    def duck(attempt: int) -> int:
        out = root / f"duckdb-{attempt}.parquet"
        columns = (
            "{RemoteAddr:'VARCHAR', Interface:'VARCHAR', TimestampNanos:'BIGINT[]', "
            "RxBytes:'BIGINT[]', TxBytes:'BIGINT[]'}"
        )
        duckdb.connect().execute(
            "COPY (SELECT RemoteAddr, Interface, unnest(TimestampNanos) AS TimestampNanos, "
            "unnest(RxBytes) AS RxBytes, unnest(TxBytes) AS TxBytes "
            f"FROM read_ndjson('{ndjson}', columns={columns})) "
            f"TO '{out}' (FORMAT parquet, COMPRESSION zstd)"
        )
        rows = parquet_rows(str(out))
        out.unlink()
        return rows

    def spark_json(attempt: int) -> int:
        from pyspark.sql import functions as F

        out = root / f"spark-json-{attempt}"
        schema = (
            "RemoteAddr string, Interface string, TimestampNanos array<bigint>, "
            "RxBytes array<bigint>, TxBytes array<bigint>"
        )
        zipped = F.explode(F.arrays_zip("TimestampNanos", "RxBytes", "TxBytes")).alias("s")
        (
            spark.read.schema(schema)
            .json(str(ndjson))
            .select("RemoteAddr", "Interface", zipped)
            .select("RemoteAddr", "Interface", "s.TimestampNanos", "s.RxBytes", "s.TxBytes")
            .write.option("compression", "zstd")
            .parquet(str(out))
        )
        rows = parquet_rows(f"{out}/*.parquet")
        shutil.rmtree(out)
        return rows

    warm_uri, _, _ = prepare(root / "warm", 40, args.samples)
    uri, warm_uri = warm_uri, uri
    sluice(99)  # warm-up: Python workers started, JIT warmed, schema plan cached
    uri = warm_uri

    contenders = (("sluice", sluice), ("duckdb", duck), ("spark-json", spark_json))
    times: dict[str, list[float]] = {label: [] for label, _ in contenders}
    for attempt in range(args.repeat):  # rounds, so a busy moment does not favour anyone
        for label, run in contenders:
            times[label].append(timed(label, run, attempt, total))
    results = {}
    for label, _ in contenders:
        seconds = min(times[label])
        results[label] = total / seconds
        print(f"  {label:<11} {seconds:7.2f} s  {results[label] / 1e6:6.2f} M samples/s")
    print(f"spark session start-up (once per job): {startup:.1f} s")
    print(f"sluice / duckdb     = {results['sluice'] / results['duckdb']:.2f}x")
    print(f"sluice / spark-json = {results['sluice'] / results['spark-json']:.2f}x")
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    if args.write_results:
        what = f"{args.events} events x {args.samples} samples to Parquet (best of {args.repeat})"
        figures = [
            Figure(what, "M samples/s", results["sluice"] / 1e6, results[peer] / 1e6, peer)
            for peer in ("duckdb", "spark-json")
        ]
        figures.append(Figure("Spark session start-up (once per job)", "s", startup))
        print(f"wrote {recorder.write(figures)}")


if __name__ == "__main__":
    main()
