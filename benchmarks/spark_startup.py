"""A catch-up (mirror + export, `--available-now`) as a new process: cold JVM vs warm Spark.

    .venv/bin/python benchmarks/spark_startup.py [--rounds 3] [--events 100] [--samples 1000]

Each round appends `events x samples` new NIC samples to an edge stream and runs, as a new
Python process each (as a Dagster run or `sluice run` is), the mirror (edge -> cloud) and the
export (cloud -> Parquet + CSV) until caught up, once per contender, side by side:

- `local`: `SLUICE_SPARK_REMOTE=local`, a local JVM (`local[2]`) per process, without the
  archive of Spark's classes (`SLUICE_SPARK_CLASS_ARCHIVE=false`);
- `archive`: the same, with the archive (`pipeline/spark/class_archive.py`; built before the
  first round if missing, not counted);
- `connect`: attached to a Spark Connect server (`pipeline/spark/connect.py`) started once
  with the same configuration (`local[2]`).

Every contender has its own stores and checkpoints; every round checks that the mirror and
the export hold exactly the samples written so far. The child prints where its wall time
went (imports, session, each job); the first round (new checkpoints, cold caches on the
server) is shown apart from the steady rounds. `benchmarks/README.md` has the conventions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_609_363_757_807_000_000


def nic_payload(i: int, samples: int) -> bytes:
    """A NIC event as the collector writes it: `samples` samples 1 ms apart."""
    stamps = [T0 + (i * samples + k) * 1_000_000 for k in range(samples)]
    event = {
        "TimestampNanos": stamps,
        "RxBytes": [719_763_680 + 1500 * (i * samples + k) for k in range(samples)],
        "TxBytes": [4_594_274 + 200 * (i * samples + k) for k in range(samples)],
        "RemoteAddr": "ubuntu",
        "Interface": f"ens{33 + i % 2}",
        "LastTimestampFormatted": "2020-12-30T21:29:17.809Z",
    }
    return json.dumps(event, separators=(",", ":")).encode()


def append(edge: str, first: int, events: int, samples: int) -> None:
    from pipeline.streams import open_store

    with open_store(edge) as store:
        if not store.stream_exists("bench/network"):
            store.create_stream("bench/network", segments=2)
        txn = store.begin_transaction("bench/network")
        for i in range(first, first + events):
            txn.write(nic_payload(i, samples), f"ens{33 + i % 2}")
        txn.commit()


# --- the child: one catch-up, as a new process -------------------------------------------


def child(root: Path) -> None:
    """Run the mirror and the export until caught up; print where the time went as JSON."""
    marks = {"python": time.monotonic() - float(os.environ["BENCH_SPAWNED"])}
    started = time.monotonic()
    from pipeline.jobs.export import ExportSpec, export
    from pipeline.jobs.mirror import MirrorSpec, mirror
    from pipeline.jobs.runner import RunOptions
    from pipeline.spark.session import spark_session

    marks["imports"] = time.monotonic() - started
    started = time.monotonic()
    spark = spark_session()
    marks["session"] = time.monotonic() - started
    edge, cloud = f"embedded:{root / 'edge'}", f"embedded:{root / 'cloud'}"
    run = RunOptions(mode="available-now", checkpoint=root / "checkpoints" / "mirror")
    started = time.monotonic()
    mirrored = mirror(spark, MirrorSpec("bench/network", "cloud/network", edge, cloud), run)
    run = RunOptions(mode="available-now", checkpoint=root / "checkpoints" / "export")
    marks["mirror"] = time.monotonic() - started
    started = time.monotonic()
    spec = ExportSpec("cloud/network", "NetworkSamples", root / "out", cloud, ("parquet", "csv"))
    exported = export(spark, spec, run)
    marks["export"] = time.monotonic() - started
    marks["batches"] = [
        b.duration_ms / 1000 for b in (*mirrored.batches, *exported.batches)
    ]  # Spark's own batch durations
    print(json.dumps(marks))


def run_child(root: Path, env: dict[str, str]) -> dict:
    started = time.monotonic()
    env = {**env, "BENCH_SPAWNED": str(started)}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(root)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if done.returncode != 0:
        msg = f"catch-up in {root} failed:\n{done.stderr[-3000:]}"
        raise SystemExit(msg)
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    marks["wall"] = wall
    return marks


def check(root: Path, expected: int) -> None:
    """The cloud stream and the Parquet export hold exactly `expected` samples."""
    import duckdb

    pattern = f"{root / 'out'}/parquet/date=*/hour=*/*.parquet"
    query = f"SELECT count(*), count(DISTINCT TimestampNanos) FROM read_parquet('{pattern}')"
    rows, distinct = duckdb.connect().execute(query).fetchall()[0]
    if rows != expected or distinct != expected:
        msg = f"{root}: export holds {rows} rows ({distinct} distinct), expected {expected}"
        raise SystemExit(msg)


def child_env(home: Path, remote: str, archive: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICE_")}
    env.update(
        SLUICE_HOME=str(home),
        SLUICE_CONFIG=str(ROOT / "sluice.toml"),
        SLUICE_SPARK_MASTER="local[2]",
        SLUICE_SPARK_REMOTE=remote,
        SLUICE_SPARK_CLASS_ARCHIVE="true" if archive else "false",
        PYTHONPATH=str(ROOT),
    )
    return env


def line(label: str, marks: dict) -> str:
    parts = " ".join(
        f"{k} {marks[k]:5.2f}" for k in ("python", "imports", "session", "mirror", "export")
    )
    batches = ",".join(f"{b:.2f}" for b in marks["batches"])
    return f"  {label:<8} wall {marks['wall']:6.2f} s = {parts} (batches {batches})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return

    from pipeline.spark.class_archive import archive_path, build
    from pipeline.spark.connect import python_daemons, start_server, stop_server
    from pipeline.spark.session import SparkSettings, spark_conf

    started = time.monotonic()
    archive = archive_path()
    if archive is None or not build(archive, wait=True):
        msg = "the archive of Spark's classes could not be built (no Java?)"
        raise SystemExit(msg)
    print(f"class archive {archive} ready in {time.monotonic() - started:.1f} s (not counted)")
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-startup-"))
    names = ("local", "archive", "connect")
    contenders = {name: work / name for name in names}
    home = work / "home"
    started = time.monotonic()
    conf = spark_conf(SparkSettings(master="local[2]", app_name="bench-connect"))
    server = start_server(home, conf)
    print(f"connect server up in {time.monotonic() - started:.1f} s (once, not counted)")
    envs = {
        "local": child_env(home, "local"),
        "archive": child_env(home, "local", archive=True),
        "connect": child_env(home, server.url),
    }
    per_round = args.events * args.samples
    walls: dict[str, list[float]] = {label: [] for label in contenders}
    try:
        for n in range(args.rounds + 1):
            for label, root in contenders.items():
                append(f"embedded:{root / 'edge'}", n * args.events, args.events, args.samples)
                marks = run_child(root, envs[label])
                check(root, (n + 1) * per_round)
                print(line(f"{label}{'*' if n == 0 else ''}", marks), flush=True)
                if n:
                    walls[label].append(marks["wall"])
        daemons = python_daemons(server.pid)
        print(f"the server holds {daemons} Python daemons after {args.rounds + 1} catch-ups")
    finally:
        stop_server(home)
        if not all(walls.values()):
            shutil.rmtree(work, ignore_errors=True)
    print("(* first round: new checkpoints; not counted)")
    best = {label: min(w) for label, w in walls.items()}
    print(
        f"catch-up of {per_round:,} new samples, best of {args.rounds}: "
        f"local {best['local']:.2f} s, archive {best['archive']:.2f} s, "
        f"connect {best['connect']:.2f} s; local / archive = "
        f"{best['local'] / best['archive']:.2f}x, local / connect = "
        f"{best['local'] / best['connect']:.2f}x; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
