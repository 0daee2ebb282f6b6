"""Replay and analytics at scale, each beside a plain peer in the same run.

    .venv/bin/python benchmarks/replay.py [--replay-samples 10000000] [--rate-samples 100000000]

1. a 10M-sample slice replayed end to end with the NIC throughput model (`sluice replay`)
   beside a plain `store.read` + `json.loads` + pandas script with the same model;
2. per-sample rx/tx Mbit/s over 100M exported samples: the DuckDB `rates` view beside
   pyarrow + numpy. Figures: seconds, samples/s, the ratio peer/sluice (`benchmarks/README.md`)."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from results import Figure, Recorder  # benchmarks/results.py, beside this script

SAMPLES_PER_EVENT = 1000
T0 = 1_793_527_200_000_000_000
MS = 1_000_000


# --- 1. replay ------------------------------------------------------------------------------


def write_nic_stream(store, stream: str, samples: int) -> None:
    rng = np.random.default_rng(7)
    store.create_stream(stream, segments=2)
    hosts = ["edge1", "edge2"]
    counters = dict.fromkeys(hosts, 0)
    writer = store.writer(stream)
    for k in range(samples // SAMPLES_PER_EVENT):
        host = hosts[k % 2]
        t0 = T0 + (k // 2) * SAMPLES_PER_EVENT * MS
        deltas = rng.integers(0, 20_000, SAMPLES_PER_EVENT)
        rx = counters[host] + np.cumsum(deltas)
        counters[host] = int(rx[-1])
        payload = {
            "RemoteAddr": host,
            "Interface": "eth0",
            "TimestampNanos": (t0 + np.arange(SAMPLES_PER_EVENT) * MS).tolist(),
            "RxBytes": rx.tolist(),
            "TxBytes": (rx // 10).tolist(),
        }
        writer.write(json.dumps(payload).encode(), routing_key=host)
    writer.flush()


def naive_replay(store, record, out: Path) -> int:
    import pandas as pd

    from pipeline.models.nic import throughput

    frames = []
    for event in store.read(record.stream, *record.cuts):
        data = json.loads(event.payload)
        n = len(data["TimestampNanos"])
        frames.append(
            pd.DataFrame(
                {
                    "RemoteAddr": [data["RemoteAddr"]] * n,
                    "Interface": [data["Interface"]] * n,
                    "TimestampNanos": data["TimestampNanos"],
                    "RxBytes": data["RxBytes"],
                    "TxBytes": data["TxBytes"],
                }
            )
        )
    frame = pd.concat(frames, ignore_index=True)
    results, _ = throughput(frame)
    results.to_parquet(out)
    return len(frame)


def bench_replay(samples: int, work: Path) -> Figure:
    from pipeline.jobs.replay import load_model, replay
    from pipeline.jobs.slices import SliceRecord, record_slices
    from pipeline.schemas import flatten_plan
    from pipeline.spark.session import SparkSettings, spark_session
    from pipeline.streams import open_store

    stream = "bench/network"
    store = open_store(f"embedded:{work / 'streams'}")
    start = time.perf_counter()
    write_nic_stream(store, stream, samples)
    print(f"replay: wrote {samples:,} samples in {time.perf_counter() - start:.1f} s")
    record = SliceRecord.create(
        stream=stream,
        sensor=None,
        start_cut=store.head(stream),
        end_cut=store.tail(stream),
        start_time_ns=T0,
        end_time_ns=T0 + samples * MS,
        reason="benchmark",
        created_by="bench",
    )
    record_slices(store, [record])
    # The driver collects the flattened slice (10 M rows) through the JVM: give it room.
    conf = (("spark.driver.memory", "8g"),)
    spark = spark_session(SparkSettings(master="local[2]", conf=conf))
    plan = flatten_plan("NetworkSamples")
    model = load_model("pipeline.models.nic:throughput")
    replay(spark, store, record.slice_id, model, plan=plan, home=work / "warm")  # JVM warm-up
    start = time.perf_counter()
    result = replay(spark, store, record.slice_id, model, plan=plan, home=work / "home")
    ours = time.perf_counter() - start
    rows = result.lineage.input_rows
    start = time.perf_counter()
    peer_rows = naive_replay(store, record, work / "naive.parquet")
    peer = time.perf_counter() - start
    if rows != peer_rows or rows != samples:
        msg = f"row counts differ: sluice {rows}, peer {peer_rows}, written {samples}"
        raise SystemExit(msg)
    print(
        f"  sluice replay (Spark local[2] + model)  {ours:8.1f} s  {rows / ours:12,.0f} samples/s"
    )
    print(f"  peer json+pandas (same model)          {peer:8.1f} s  {rows / peer:12,.0f} samples/s")
    print(f"  ratio peer/sluice: {peer / ours:.2f}x")
    store.close()
    what = f"replay a {samples:,}-sample slice (Spark local[2] + model)"
    return Figure(what, "samples/s", rows / ours, rows / peer, "json + pandas")


# --- 2. rates -------------------------------------------------------------------------------


def write_export(root: Path, samples: int, nics: int = 4, per_file: int = 5_000_000) -> None:
    """`samples` rows over `nics` NICs at 1 kHz, in hive `date=`/`hour=` partitions."""
    rng = np.random.default_rng(3)
    per_nic = samples // nics
    hour_ns = 3_600 * 1_000_000_000
    written = 0
    for nic in range(nics):
        rx_total = 0
        for first in range(0, per_nic, per_file):
            n = min(per_file, per_nic - first)
            t = T0 + (first + np.arange(n, dtype=np.int64)) * MS
            rx = rx_total + np.cumsum(rng.integers(0, 20_000, n))
            rx_total = int(rx[-1])
            hour = int((t[0] - T0) // hour_ns)
            folder = root / "parquet" / "date=2026-11-01" / f"hour={10 + hour:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            table = pa.table(
                {
                    "RemoteAddr": pa.array(np.full(n, f"edge{nic // 2}"), pa.string()),
                    "Interface": pa.array(np.full(n, f"eth{nic % 2}"), pa.string()),
                    "TimestampNanos": t,
                    "RxBytes": rx,
                    "TxBytes": rx // 10,
                    "_segment": np.zeros(n, np.int32),
                    "_offset": (first + np.arange(n)) // 1000 * 60_000,
                    "_sample": ((first + np.arange(n)) % 1000).astype(np.int32),
                }
            )
            pq.write_table(table, folder / f"part-{nic}-{first // per_file:05d}.parquet")
            written += n
    return written


def numpy_rates(root: Path) -> tuple[int, dict]:
    import pyarrow.dataset as ds

    dataset = ds.dataset(root / "parquet", format="parquet", partitioning="hive")
    table = dataset.to_table(columns=["RemoteAddr", "Interface", "TimestampNanos", "RxBytes"])
    nic = pa.compute.binary_join_element_wise(table["RemoteAddr"], table["Interface"], "/")
    codes = nic.combine_chunks().dictionary_encode()
    keys = codes.indices.to_numpy()
    t = table["TimestampNanos"].to_numpy()
    rx = table["RxBytes"].to_numpy()
    order = np.lexsort((t, keys))
    keys, t, rx = keys[order], t[order], rx[order]
    same = keys[1:] == keys[:-1]
    rates = (np.diff(rx) * 8 / 1e6) / (np.diff(t) / 1e9)
    rates = rates[same]
    owner = keys[1:][same]
    summary = {
        str(codes.dictionary[k]): (float(rates[owner == k].max()), float(rates[owner == k].mean()))
        for k in np.unique(owner)
    }
    return len(t), summary


def duckdb_rates(work: Path, root: Path) -> tuple[int, dict]:
    from pipeline.analytics.catalog import refresh
    from pipeline.analytics.sandbox import query
    from pipeline.analytics.sources import AnalyticsPaths, ExportSource

    paths = AnalyticsPaths(work, work / "analytics" / "bench.duckdb")
    refresh(paths, [ExportSource("bench", root, "bench/network", "NetworkSamples")])
    _, rows = query(
        paths,
        "SELECT RemoteAddr || '/' || Interface, max(rx_mbps), avg(rx_mbps), count(*) "
        "FROM rates GROUP BY 1 ORDER BY 1",
    )
    return sum(r[3] for r in rows), {r[0]: (r[1], r[2]) for r in rows}


def bench_rates(samples: int, work: Path) -> Figure:
    root = work / "export"
    start = time.perf_counter()
    write_export(root, samples)
    print(f"rates: wrote {samples:,} exported samples in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    n_duck, duck = duckdb_rates(work, root)
    ours = time.perf_counter() - start
    start = time.perf_counter()
    n_np, peer_summary = numpy_rates(root)
    peer = time.perf_counter() - start
    for key, (peak, mean) in peer_summary.items():
        if abs(duck[key][0] - peak) > 1e-6 * peak or abs(duck[key][1] - mean) > 1e-6 * mean:
            msg = f"rates differ for {key}: duckdb {duck[key]}, numpy {(peak, mean)}"
            raise SystemExit(msg)
    print(
        f"  duckdb rates view (window functions)   {ours:8.1f} s  {n_duck / ours:12,.0f} samples/s"
    )
    print(f"  peer pyarrow+numpy (sort + diff)       {peer:8.1f} s  {n_np / peer:12,.0f} samples/s")
    print(f"  ratio peer/duckdb: {peer / ours:.2f}x")
    what = f"per-sample rates over {samples:,} exported samples (DuckDB rates view)"
    return Figure(what, "samples/s", n_duck / ours, n_np / peer, "pyarrow + numpy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay-samples", type=int, default=10_000_000)
    parser.add_argument("--rate-samples", type=int, default=100_000_000)
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder, figures = Recorder(__file__, __doc__, args.work), []
    work = args.work or Path(tempfile.mkdtemp(prefix="sluice-bench-replay-"))
    try:
        if args.replay_samples:
            figures.append(bench_replay(args.replay_samples, work / "replay"))
        if args.rate_samples:
            figures.append(bench_rates(args.rate_samples, work / "rates"))
        if args.write_results:
            print(f"wrote {recorder.write(figures)}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
