"""Export: NIC events -> flattened Parquet (zstd), Sluice beside DuckDB and Spark's JSON reader.

    .venv/bin/python benchmarks/export.py [--events 10000] [--samples 1000]

The same events become one Parquet row per sample by the export job's code path (`sluice`
source ranges -> `sluice-export` tasks, as one batch), by DuckDB (`read_ndjson`, `unnest`,
`COPY`) and by Spark's own JSON reader (`arrays_zip` + `explode`), on the same cores; Spark
is warmed up first, each contender's best of `--repeat` rounds counts, and every output is
checked to hold events x samples rows first. `--profile` also breaks one task's work into
its stages, in this process (`benchmarks/README.md`)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.durable import fsync_path
from pipeline.schemas import FlattenPlan, flatten, flatten_plan
from pipeline.schemas.flatten import _read_whole  # the stage timed on its own
from pipeline.spark.export_writer import by_hour, export_task, parquet_options, range_events
from pipeline.spark.options import ExportOptions
from pipeline.spark.reading import RANGE_ARROW
from pipeline.spark.session import SparkSettings, spark_session
from pipeline.streams import open_store

T0 = 1_609_363_757_807_000_000
CORES = 2  # Spark runs local[CORES], DuckDB as many threads
R = TypeVar("R")


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


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a task's work: its best time of the profile's rounds, CPU or wall."""

    name: str
    seconds: float
    clock: str = "cpu"


def best_of(run: Callable[[], object], rounds: int) -> tuple[float, float]:
    """The least CPU time (this process) and the least wall time of `rounds` runs of `run`."""
    cpu = wall = float("inf")
    for _ in range(rounds):
        started, ticks = time.perf_counter(), time.process_time()
        run()
        cpu = min(cpu, time.process_time() - ticks)
        wall = min(wall, time.perf_counter() - started)
    return cpu, wall


def profile(uri: str, stream: str, root: Path, rounds: int) -> list[Stage]:
    """One task's work stage by stage, in this process, on the events of segment 0 (what the
    benchmark's task for segment 0 does), chunk after chunk as the task goes (`task_pass`):
    each stage's CPU, the least of `rounds` passes; the fsync's wall; then each segment's
    whole task (`export_task`) as one, CPU and wall."""
    plan = flatten_plan("NetworkSamples")
    with open_store(uri) as store:
        heads = store.head(stream).segments
        spans = {seg: (heads[seg], end) for seg, end in store.tail(stream).positions}
    passes = [task_pass(plan, uri, stream, spans[0], root / "profile") for _ in range(rounds)]
    stages = [
        Stage(name, min(p[name] for p in passes), "wall" if "fsync" in name else "cpu")
        for name in passes[0]
    ]
    for seg, span in sorted(spans.items()):
        task = partial(one_task, plan, uri, stream, (seg, *span), root)
        cpu, wall = best_of(task, rounds)
        name = f"whole task of segment {seg} (export_task)"
        stages += [Stage(name, cpu), Stage(name, wall, "wall")]
    return stages


def task_pass(
    plan: FlattenPlan, uri: str, stream: str, span: tuple[int, int], out: Path
) -> dict[str, float]:
    """A task's loop over its chunks, each stage timed (CPU) as it runs: read a chunk; parse
    its events whole with simdjson (the flatten's `_read_whole`, also done on its own to time
    it); flatten it (`flatten` less that parse is the rest of it); split by hour; write each
    hour's rows to that hour's file (the export's Parquet options) and, to time zstd, again to
    a file without compression; then close the files and fsync the task's ones and their
    directory (wall)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spent: dict[str, float] = dict.fromkeys(PROFILE_STAGES, 0.0)
    files: dict[tuple[str, int], pq.ParquetWriter] = {}
    chunks = range_events(uri, stream, 0, span)
    while (chunk := timed_stage(spent, "read", next, chunks, None)) is not None:
        if timed_stage(spent, "parse", _read_whole, plan, chunk.payloads) is None:
            msg = "the benchmark's events are not read whole: the profile would mislead"
            raise SystemExit(msg)
        result = timed_stage(spent, "rest", flatten, plan, chunk, dictionary=True)
        parts = timed_stage(spent, "split", list, by_hour(result.rows, result.time_ns))
        for hour, part in parts:
            for kind, stage in (("zstd", "zstd"), ("none", "encode")):
                writer = files.get((kind, hour)) or open_file(files, plan, out, (kind, hour), part)
                timed_stage(spent, stage, writer.write_table, part)
    spent["rest"] -= spent["parse"]
    spent["zstd"] -= spent["encode"]
    started = time.perf_counter()
    for (kind, hour), writer in files.items():
        writer.close()
        if kind == "none":  # only there to time zstd: not the task's file
            (out / f"{kind}-{hour}.parquet").unlink()
    fsync_all(out)
    spent["fsync"] = time.perf_counter() - started
    shutil.rmtree(out)
    return {PROFILE_STAGES[key]: seconds for key, seconds in spent.items()}


PROFILE_STAGES = {
    "read": "read the range from the store",
    "parse": "flatten: events parsed whole (simdjson), their arrays joined into columns",
    "rest": "flatten: the rest (the table, its dictionaries and lineage columns)",
    "split": "split the rows by event hour",
    "encode": "Parquet: encoding and statistics",
    "zstd": "Parquet: zstd",
    "fsync": "close the files, fsync them and their directory",
}


def timed_stage(spent: dict[str, float], stage: str, run: Callable[..., R], *args, **kw) -> R:
    """`run(*args, **kw)`, its CPU time added to `spent[stage]`."""
    started = time.process_time()
    result = run(*args, **kw)
    spent[stage] += time.process_time() - started
    return result


def open_file(
    files: dict, plan: FlattenPlan, out: Path, key: tuple[str, int], part: pa.Table
) -> pq.ParquetWriter:
    """The profile's file for an hour's rows: the export's options, or without compression."""
    options = parquet_options(plan)
    if key[0] == "none":
        options |= {"compression": "none", "compression_level": None}
    path = out / f"{key[0]}-{key[1]}.parquet"
    writer = files[key] = pq.ParquetWriter(path, part.schema, **options)
    return writer


def fsync_all(directory: Path) -> None:
    for path in directory.iterdir():
        fsync_path(path)
    fsync_path(directory)


def one_task(
    plan: FlattenPlan, uri: str, stream: str, span: tuple[int, int, int], root: Path
) -> None:
    """`export_task` on one segment's range, as the export's task for it runs, outside Spark."""
    out = root / "profile-task"
    options = {"schema": plan.name, "output": str(out), "formats": "parquet"}
    opts = ExportOptions.parse({**options, "maxRowsPerFile": "5000000"})
    row = [[uri], [stream], *([value] for value in span)]  # segment, start, end
    export_task(opts, iter([pa.RecordBatch.from_arrays(row, schema=RANGE_ARROW)]))
    shutil.rmtree(out)


def profile_notes(stages: list[Stage], sluice_wall: float) -> list[str]:
    """The profile as lines: each CPU stage in ms with its share of all of them, the wall
    stages, the whole tasks; then Spark's part of the best sluice wall (planning, starting
    the tasks, the commit): that wall less the least the tasks could take side by side.

    That least is the longer task's wall alone, or, when the tasks want more CPU than the
    cores have, all their CPU over the cores: a task keeps more than one core busy (its
    writer thread encodes while it flattens the next chunk), so the tasks running together
    on `CORES` cores take longer than either alone, and that is not Spark's time."""
    parts = [s for s in stages if s.clock == "cpu" and not s.name.startswith("whole")]
    total = sum(s.seconds for s in parts)
    lines = ["one task's work (`--profile`: segment 0's events, in this process), stage by stage:"]
    lines += [f"{s.name}: {s.seconds * 1e3:.0f} ms CPU ({s.seconds / total:.0%})" for s in parts]
    lines.append(f"all the stages above: {total * 1e3:.0f} ms CPU")
    lines += [
        f"{s.name}: {s.seconds * 1e3:.0f} ms {s.clock.upper()}" for s in stages if s not in parts
    ]
    tasks = [s for s in stages if s.name.startswith("whole")]
    longest = max(s.seconds for s in tasks if s.clock == "wall")
    shared = sum(s.seconds for s in tasks if s.clock == "cpu") / CORES
    least = max(longest, shared)
    spark = sluice_wall - least
    lines.append(
        f"the tasks side by side take at least {least:.2f} s: the longer task's wall "
        f"{longest:.2f} s, or all the tasks' CPU over {CORES} cores {shared:.2f} s"
    )
    lines.append(
        f"Spark's part (planning, starting the tasks, the commit): best sluice wall "
        f"{sluice_wall:.2f} s - {least:.2f} s = {spark * 1e3:.0f} ms "
        f"({spark / sluice_wall:.0%} of the wall)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--profile", action="store_true", help="also break one task's work into its stages"
    )
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__, args.workdir)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="sluice-bench-export-"))
    total = args.events * args.samples

    print(f"preparing {args.events} events x {args.samples} samples = {total:,} samples ...")
    uri, ndjson, size = prepare(root, args.events, args.samples)
    print(f"  {size / 1e6:.0f} MB of JSON, in {root}")

    started = time.perf_counter()
    spark = spark_session(SparkSettings(master=f"local[{CORES}]", app_name="bench-export"))
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
        duckdb.connect(config={"threads": CORES}).execute(
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
        # in turns, the order reversed every other round, each after the pages the one before
        # wrote are on disk (DuckDB's and Spark's are written back only later, and that
        # writeback slowed whichever ran next: see benchmarks/README.md)
        for label, run in contenders if attempt % 2 == 0 else contenders[::-1]:
            os.sync()
            times[label].append(timed(label, run, attempt, total))
    results = {}
    for label, _ in contenders:
        seconds = min(times[label])
        results[label] = total / seconds
        print(f"  {label:<11} {seconds:7.2f} s  {results[label] / 1e6:6.2f} M samples/s")
    print(f"spark session start-up (once per job): {startup:.1f} s")
    print(f"sluice / duckdb     = {results['sluice'] / results['duckdb']:.2f}x")
    print(f"sluice / spark-json = {results['sluice'] / results['spark-json']:.2f}x")
    notes = []
    if args.profile:
        notes = profile_notes(
            profile(uri, "bench/network", root, args.repeat), min(times["sluice"])
        )
        print("\n  ".join(notes))
    if args.workdir is None:
        shutil.rmtree(root, ignore_errors=True)
    if args.write_results:
        what = f"{args.events} events x {args.samples} samples to Parquet (best of {args.repeat})"
        figures = [
            Figure(what, "M samples/s", results["sluice"] / 1e6, results[peer] / 1e6, peer)
            for peer in ("duckdb", "spark-json")
        ]
        figures.append(Figure("Spark session start-up (once per job)", "s", startup))
        print(f"wrote {recorder.write(figures, notes)}")


if __name__ == "__main__":
    main()
