"""Replay and analytics at scale, each beside a plain peer in the same run.

    .venv/bin/python benchmarks/replay.py [--replay-samples 10000000] [--rate-samples 100000000]
    .venv/bin/python benchmarks/replay.py --rate-samples 0     # the replay part only

1. a 10M-sample slice replayed end to end with the NIC throughput model (`sluice replay`)
   beside a plain `store.read` + `json.loads` + pandas script with the same model;
2. per-sample rx/tx Mbit/s over 100M exported samples: the `rates` view (a scan of the rates
   table the refresh keeps) beside a plain DuckDB aggregate over the same Parquet, pyarrow +
   numpy and the window-function definition; then the table's first build and a refresh after
   one more increment. Figures: seconds, samples/s, ratios (`benchmarks/README.md`)."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from itertools import pairwise
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


def naive_replay(store, record, out: Path) -> tuple[int, float]:
    """The peer: rows read and the seconds its model took (of the whole)."""
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
    start = time.perf_counter()
    results, _ = throughput(frame)
    model = time.perf_counter() - start
    results.to_parquet(out)
    return len(frame), model


def timed_replay(run, home: Path) -> tuple[float, object, dict[str, float]]:
    """(seconds, result, each step's start and the end) of one `run(home, on_step)`."""
    steps: dict[str, float] = {}
    start = time.perf_counter()
    result = run(home, lambda step, _count: steps.setdefault(step, time.perf_counter()))
    seconds = time.perf_counter() - start
    steps["end"] = start + seconds
    return seconds, result, steps


def bench_replay(samples: int, work: Path, repeat: int = 3) -> list[Figure]:
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
    start = time.perf_counter()
    spark = spark_session(SparkSettings(master="local[2]"))
    plan = flatten_plan("NetworkSamples")
    model = load_model("pipeline.models.nic:throughput")
    started = time.perf_counter() - start
    start = time.perf_counter()
    replay(spark, store, record.slice_id, model, plan=plan, home=work / "warm")  # first run
    first = time.perf_counter() - start

    def run(home: Path, on_step) -> object:
        return replay(spark, store, record.slice_id, model, plan=plan, home=home, on_step=on_step)

    runs, peers = [], []
    for _ in range(repeat):  # alternately, so that both see the same load
        runs.append(timed_replay(run, work / f"home-{len(runs)}"))
        start = time.perf_counter()
        peer_rows, peer_model = naive_replay(store, record, work / "naive.parquet")
        peers.append((time.perf_counter() - start, peer_model))
    rows = runs[0][1].lineage.input_rows  # type: ignore[attr-defined]
    if rows != peer_rows or rows != samples:
        msg = f"row counts differ: sluice {rows}, peer {peer_rows}, written {samples}"
        raise SystemExit(msg)
    ours, _, steps = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    peer, peer_model = sorted(peers)[len(peers) // 2]
    if repeat > 1:
        print(f"  {repeat} runs each, alternately; the medians below. Each run:")
        print("    sluice " + "  ".join(f"{run[0]:.2f}" for run in runs) + " s")
        print("    peer   " + "  ".join(f"{p[0]:.2f}" for p in peers) + " s")
        pairs = [p[0] / r[0] for r, p in zip(runs, peers, strict=True)]
        print("    ratio  " + "  ".join(f"{x:.2f}" for x in pairs) + " (each pair: peer/sluice)")
    whole = started + first
    print(f"  Spark start-up (session)               {started:8.1f} s")
    print(
        f"  first replay (Python workers start)    {first:8.1f} s  {rows / first:12,.0f} samples/s"
    )
    print(
        f"  whole run (session start-up + first)   {whole:8.1f} s  {rows / whole:12,.0f} samples/s"
    )
    print(
        f"  sluice replay (Spark local[2] + model)  {ours:8.1f} s  {rows / ours:12,.0f} samples/s"
        "  <- after start-up"
    )
    print(f"  peer json+pandas (same model)          {peer:8.1f} s  {rows / peer:12,.0f} samples/s")
    print(f"  ratio peer/sluice after start-up: {peer / ours:.2f}x (goal: >= 3)")
    print(f"  ratio peer/sluice whole run (session start-up + first replay): {peer / whole:.2f}x")
    print(f"  after start-up rate: {rows / ours / 1e6:.2f} M samples/s (goal: >= 2)")
    read, model_s, write = (steps[b] - steps[a] for a, b in pairwise([*steps]))
    print(
        f"  where the replay's time went: read (Spark tasks read + flatten, driver merge) "
        f"{read:.2f} s, model {model_s:.2f} s, write {write:.2f} s"
    )
    print(
        f"  the peer's model took {peer_model:.2f} s; without the model on either side: "
        f"ratio {(peer - peer_model) / (ours - model_s):.2f}x"
    )
    store.close()
    what = f"replay a {samples:,}-sample slice (Spark local[2] + model)"
    return [
        Figure(
            f"{what}, after start-up",
            "samples/s",
            rows / ours,
            rows / peer,
            "json + pandas",
            ">= 3x and >= 2,000,000 samples/s",
        ),
        Figure(
            f"{what}, whole run: session start-up + first replay",
            "samples/s",
            rows / whole,
            rows / peer,
            "json + pandas",
        ),
    ]


# --- 2. rates -------------------------------------------------------------------------------


def write_export(
    root: Path, samples: int, state: dict | None = None, nics: int = 4, per_file: int = 5_000_000
) -> dict:
    """`samples` rows over `nics` NICs at 1 kHz, in hive `date=`/`hour=` partitions, going on
    from `state` (each NIC's next sample and counter, as returned) when given."""
    rng = np.random.default_rng(3 if state is None else len(state) + samples)
    state = dict(state or {})
    per_nic = samples // nics
    hour_ns = 3_600 * 1_000_000_000
    for nic in range(nics):
        start, rx_total = state.get(nic, (0, 0))
        for first in range(start, start + per_nic, per_file):
            n = min(per_file, start + per_nic - first)
            index = first + np.arange(n, dtype=np.int64)
            t = T0 + index * MS
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
                    "_offset": index // 1000 * 60_000,
                    "_sample": (index % 1000).astype(np.int32),
                }
            )
            pq.write_table(table, folder / f"part-{nic}-{first // per_file:05d}-{first}.parquet")
        state[nic] = (start + per_nic, rx_total)
    return state


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


RATES_QUERY = (
    "SELECT RemoteAddr || '/' || Interface, max(rx_mbps), avg(rx_mbps), count(*) "
    "FROM {rates} GROUP BY 1 ORDER BY 1"
)


def rates_view(paths) -> tuple[int, dict]:
    """What an analyst runs all day: the `rates` view, through `sluice sql`'s sandbox."""
    from pipeline.analytics.sandbox import query

    _, rows = query(paths, RATES_QUERY.format(rates="rates"))
    return sum(r[3] for r in rows), {r[0]: (r[1], r[2]) for r in rows}


def window_rates(paths) -> tuple[int, dict]:
    """The same query over the window-function definition (what the view computed per query
    before the rates table), with the refresh's memory cap: at 100M samples DuckDB's default
    (80% of the memory) gets it killed on a machine shared with other work."""
    import duckdb

    from pipeline.analytics.rates import rates_sql
    from pipeline.analytics.rates_table import memory_limit_mb

    with duckdb.connect(str(paths.database), read_only=True) as con:
        con.execute(f"SET VARIABLE sluice_home = '{paths.home}'")
        con.execute(f"SET memory_limit = '{memory_limit_mb()}MB'")
        sql = RATES_QUERY.format(rates=f"({rates_sql('network_samples')})")
        rows = con.execute(sql).fetchall()
    return sum(r[3] for r in rows), {r[0]: (r[1], r[2]) for r in rows}


def plain_scan(root: Path) -> tuple[int, dict]:
    """A plain DuckDB aggregate over the same Parquet: the floor a per-sample query stands on."""
    import duckdb

    files = root / "parquet" / "date=*" / "hour=*" / "*.parquet"
    with duckdb.connect() as con:
        rows = con.execute(
            "SELECT RemoteAddr || '/' || Interface, max(RxBytes), avg(RxBytes), count(*) "
            f"FROM read_parquet('{files}', hive_partitioning = true) GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return sum(r[3] for r in rows), {r[0]: (r[1], r[2]) for r in rows}


def _timed(run, repeat: int = 1):
    """The best of `repeat` runs: seconds, and the result."""
    best = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    return best, result


def _continuous(paths, samples: int) -> None:
    """Every sample but each NIC's first has a rate, 1 ms after the previous one."""
    from pipeline.analytics.sandbox import query

    sql = "SELECT count(*), count(*) FILTER (interval_s IS NULL), min(interval_s), max(interval_s) "
    _, [got] = query(paths, f"{sql} FROM rates")
    if got != (samples, 4, 0.001, 0.001):
        msg = f"the rates after the increment are not continuous: {got}"
        raise SystemExit(msg)


def _line(label: str, seconds: float, samples: int) -> None:
    print(f"  {label:<38} {seconds:8.2f} s  {samples / seconds:12,.0f} samples/s")


def _same(name: str, got: dict, peer: dict) -> None:
    for key, (peak, mean) in peer.items():
        if abs(got[key][0] - peak) > 1e-6 * peak or abs(got[key][1] - mean) > 1e-6 * mean:
            msg = f"rates differ for {key}: {name} {got[key]}, numpy {(peak, mean)}"
            raise SystemExit(msg)


def bench_rates(samples: int, work: Path) -> list[Figure]:
    """The rates view (a scan of the rates table) beside a plain DuckDB aggregate over the same
    Parquet and a pyarrow+numpy script; then what keeping the table costs: its first build,
    and a refresh after one more export increment (1% more samples)."""
    from pipeline.analytics.catalog import refresh
    from pipeline.analytics.sources import AnalyticsPaths, ExportSource

    root = work / "export"
    seconds, state = _timed(lambda: write_export(root, samples))
    print(f"rates: wrote {samples:,} exported samples in {seconds:.1f} s")
    paths = AnalyticsPaths(work, work / "analytics" / "bench.duckdb")
    sources = [ExportSource("bench", root, "bench/network", "NetworkSamples")]
    build, _ = _timed(lambda: refresh(paths, sources))
    print(f"  first build of the rates table (refresh) {build:.2f} s")
    ours, (n_view, view) = _timed(lambda: rates_view(paths), repeat=3)
    _line("rates view (scan of the rates table)", ours, n_view)
    plain, (n_plain, _) = _timed(lambda: plain_scan(root), repeat=3)
    _line("plain DuckDB aggregate (same Parquet)", plain, n_plain)
    peer, (n_np, peer_summary) = _timed(lambda: numpy_rates(root))
    _line("peer pyarrow+numpy (sort + diff)", peer, n_np)
    window, (n_window, defined) = _timed(lambda: window_rates(paths))
    _line("window functions (the definition)", window, n_window)
    if not n_view == n_plain == n_np == n_window == samples:
        msg = (
            f"sample counts differ: view {n_view}, plain {n_plain}, numpy {n_np}, window {n_window}"
        )
        raise SystemExit(msg)
    _same("rates view", view, peer_summary)
    _same("window functions", defined, peer_summary)
    print(f"  ratio view/plain scan: {ours / plain:.2f}x  (the goal: under 3x)")
    print(f"  ratio peer/view: {peer / ours:.2f}x   ratio window/view: {window / ours:.2f}x")
    increment = max(samples // 100, 4)
    write_export(root, increment, state)
    again, _ = _timed(lambda: refresh(paths, sources))
    _continuous(paths, samples + increment // 4 * 4)
    print(
        f"  keeping the table: first build {build:.2f} s ({build / window:.2f}x one window query),"
    )
    print(f"    refresh after {increment // 4 * 4:,} more samples {again:.2f} s")
    rate = f"per-sample rates over {samples:,} exported samples"
    return [
        Figure(
            f"{rate}: the rates view", "samples/s", n_view / ours, n_np / peer, "pyarrow + numpy"
        ),
        Figure(
            f"{rate}: the rates view beside a plain aggregate over the same Parquet",
            "samples/s",
            n_view / ours,
            n_plain / plain,
            "plain DuckDB aggregate",
            "within 3x (ratio >= 0.33)",
        ),
        Figure(
            f"{rate}: first build of the rates table (refresh)",
            "s",
            build,
            window,
            "one window-function query",
        ),
        Figure(
            f"{rate}: refresh after {increment // 4 * 4:,} more samples",
            "s",
            again,
            window,
            "one window-function query",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replay-samples", type=int, default=10_000_000)
    parser.add_argument("--rate-samples", type=int, default=100_000_000)
    parser.add_argument(
        "--repeat", type=int, default=3, help="timed replays and peer runs, alternately (median)"
    )
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temp dir)")
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder, figures = Recorder(__file__, __doc__, args.work), []
    work = args.work or Path(tempfile.mkdtemp(prefix="sluice-bench-replay-"))
    try:
        if args.replay_samples:
            figures.extend(bench_replay(args.replay_samples, work / "replay", args.repeat))
        if args.rate_samples:
            figures.extend(bench_rates(args.rate_samples, work / "rates"))
        if args.write_results:
            print(f"wrote {recorder.write(figures)}")
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
