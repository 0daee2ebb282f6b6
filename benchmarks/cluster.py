"""Export throughput on a Spark standalone cluster: 1 worker vs 2 workers (the scaling ratio).

    .venv/bin/python benchmarks/cluster.py [--events 10000] [--samples 1000] [--batches 8]

A master and one-core workers start on loopback (`pipeline/spark/standalone.py`) and `sluice
run export` runs against them with SLUICE_SPARK_MASTER set, as a user would switch a job to a
cluster. Figures: wall time, and steady-state throughput over the batches after the first
(which also pays for starting the executors). On a machine with few cores the second worker
competes with the driver for them (`benchmarks/README.md`)."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results import Figure, Recorder  # noqa: E402  (benchmarks/results.py, beside this script)

from benchmarks.export import parquet_rows, prepare  # noqa: E402
from pipeline.spark.standalone import standalone_cluster  # noqa: E402

BATCH_LINE = re.compile(r"export batch (\d+): (\d+) events, (\d+) rows, .*?, (\d+) ms,")


@dataclass(frozen=True)
class Run:
    seconds: float
    batches: list[tuple[int, int, int]]  # (batch id, rows, duration ms)

    def steady_rate(self) -> float:
        """Rows per second over the batches after the first."""
        later = [b for b in self.batches if b[0] > 0]
        return sum(b[1] for b in later) / (sum(b[2] for b in later) / 1000)


def export(master: str, store: str, argv_tail: list[str], output: Path, home: Path) -> Run:
    env = {**os.environ, "SLUICE_SPARK_MASTER": master, "SLUICE_HOME": str(home)}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "pipeline.cli", "--store", store, "run", "export"]
    argv += ["--schema", "NetworkSamples", "--output", str(output), *argv_tail]
    argv += ["--format", "parquet", "--checkpoint", str(output / "_checkpoint")]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=home, capture_output=True, check=False, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    batches = [(int(m[1]), int(m[3]), int(m[4])) for m in BATCH_LINE.finditer(done.stderr)]
    return Run(time.perf_counter() - started, batches)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=10000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=8)
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)
    per_batch = -(-args.events // args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store, _, size = prepare(root, args.events, args.samples)
        expected = args.events * args.samples
        print(f"{args.events} NIC events, {expected:,} samples, {size / 1e6:.0f} MB of JSON")
        results: dict[int, Run] = {}
        for workers in (1, 2):
            with standalone_cluster(root / f"cluster-{workers}", workers=workers) as cluster:
                home = root / f"home-{workers}"
                home.mkdir()
                out = root / f"out-{workers}"
                tail = ["--stream", "bench/network", "--max-events", str(per_batch)]
                run = export(cluster.master, store, tail, out, home)
                rows = parquet_rows(f"{out}/parquet/date=*/hour=*/*.parquet")
                if rows != expected:
                    msg = f"{workers} worker(s) wrote {rows} rows, expected {expected}"
                    raise SystemExit(msg)
                results[workers] = run
                print(
                    f"  {workers} worker(s) x 1 core: {run.seconds:6.1f} s wall "
                    f"({expected / run.seconds / 1e6:4.2f} M samples/s), "
                    f"{len(run.batches)} batches, after the first "
                    f"{run.steady_rate() / 1e6:4.2f} M samples/s"
                )
        one, two = results[1], results[2]
        print(
            f"scaling ratio 2 workers / 1 worker: {one.seconds / two.seconds:.2f}x wall time, "
            f"{two.steady_rate() / one.steady_rate():.2f}x steady-state throughput"
        )
    if args.write_results:
        what = f"export {expected:,} samples in {args.batches} batches, 2 workers"
        wall = [expected / results[w].seconds / 1e6 for w in (2, 1)]
        steady = [results[w].steady_rate() / 1e6 for w in (2, 1)]
        figures = [
            Figure(f"{what}, wall (start-up included)", "M samples/s", *wall, "1 worker"),
            Figure(f"{what}, after the first batch", "M samples/s", *steady, "1 worker"),
        ]
        print(f"wrote {recorder.write(figures)}")


if __name__ == "__main__":
    main()
