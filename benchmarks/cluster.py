"""Export throughput on a Spark standalone cluster: 1 worker vs 2 workers (the scaling ratio).

    .venv/bin/python benchmarks/cluster.py [--events 3000] [--samples 1000]

A master and workers of one core each are started on loopback from pyspark's own scripts
(tests/spark/standalone.py); `sluice run export` runs against the cluster with
SLUICE_SPARK_MASTER set, as a user would switch a job to a cluster. The same NIC events
(benchmarks/export.py's generator) are exported with 1 executor (one worker) and then with 2
(two workers); each wall time includes the application's start-up, printed beside it from a
run over an empty stream. Rows are checked before figures print.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.export import parquet_rows, prepare  # noqa: E402
from tests.spark.standalone import standalone_cluster  # noqa: E402


def export(master: str, store: str, stream: str, output: Path, home: Path) -> float:
    env = {**os.environ, "SLUICE_SPARK_MASTER": master, "SLUICE_HOME": str(home)}
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-m", "pipeline.cli", "--store", store, "run", "export"]
    argv += ["--stream", stream, "--schema", "NetworkSamples", "--output", str(output)]
    argv += ["--format", "parquet", "--checkpoint", str(output / "_checkpoint")]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=home, capture_output=True, check=False)
    if done.returncode != 0:
        raise SystemExit(done.stderr.decode()[-3000:])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--samples", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        store, _, size = prepare(root, args.events, args.samples)
        from pipeline.streams import open_store

        with open_store(store) as s:
            s.create_stream("bench/empty", segments=2)
        expected = args.events * args.samples
        print(f"{args.events} NIC events, {expected:,} samples, {size / 1e6:.0f} MB of JSON")
        results = {}
        for workers in (1, 2):
            with standalone_cluster(root / f"cluster-{workers}", workers=workers) as cluster:
                home = root / f"home-{workers}"
                home.mkdir()
                startup = export(cluster.master, store, "bench/empty", root / f"e{workers}", home)
                out = root / f"out-{workers}"
                seconds = export(cluster.master, store, "bench/network", out, home)
                rows = parquet_rows(f"{out}/parquet/date=*/hour=*/*.parquet")
                if rows != expected:
                    msg = f"{workers} worker(s) wrote {rows} rows, expected {expected}"
                    raise SystemExit(msg)
                results[workers] = seconds
                print(
                    f"  {workers} worker(s) x 1 core: {seconds:6.1f} s  "
                    f"{expected / seconds / 1e6:5.2f} M samples/s  "
                    f"(of which start-up, empty stream: {startup:4.1f} s)"
                )
        print(f"scaling ratio 2 workers / 1 worker: {results[1] / results[2]:.2f}x")


if __name__ == "__main__":
    main()
