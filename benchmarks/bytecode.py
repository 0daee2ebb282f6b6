"""Python processes with compiled bytecode (`make install`) beside the same without it.

    .venv/bin/python benchmarks/bytecode.py [--rounds 3] [--events 45]

Where PYTHONDONTWRITEBYTECODE is set (this machine, many CI images) Python writes no `.pyc`,
and a virtual environment installed without `--compile-bytecode` has none: every process then
compiles every module it imports, again. A Sluice job starts many: its driver, and inside
Spark each Python worker, planner and (under Spark Connect) `foreachBatch` process. Measured,
in turns, with the install's bytecode and without it (`PYTHONPYCACHEPREFIX` pointed at an
empty directory and PYTHONDONTWRITEBYTECODE=1: Python finds no `.pyc` and writes none):

1. the wall time of `python -c "import M"` for the modules such processes import; the median
   of `--rounds`;
2. the wall time of importing `pyspark.worker` from Spark's `pyspark.zip`, as every Python
   process Spark starts does: the zip with the bytecode `make install` adds
   (`pipeline/spark/zip_bytecode.py`) beside a copy of it with the source only, as the
   pyspark wheel ships it;
3. one short `sluice run mirror` driver (a local Spark, `--max-events 25` over `--events` new
   events: two batches), as each life of the kill suites runs it; the median of `--rounds`.
   Both sides use Spark's `pyspark.zip` as installed: this figure is site-packages' bytecode
   and Sluice's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.spark.zip_bytecode import has_bytecode, pyspark_zip
from pipeline.streams import open_store

ROOT = Path(__file__).resolve().parents[1]
#: What a Spark Python worker, the Connect server's `foreachBatch` process, the data source
#: planner and a job's driver import first.
MODULES = (
    "pyspark.worker",
    "pyspark.sql.connect.streaming.worker.foreach_batch_worker",
    "pandas",
    "pipeline.spark.source",
    "pipeline.cli.run",
)


def environment(work: Path, bytecode: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env.update(PYTHONPATH=str(ROOT), SLUICE_HOME=str(work / "home"))
    env.update(SLUICE_SPARK_MASTER="local[2]", SLUICE_SPARK_REMOTE="local")
    if not bytecode:
        empty = work / "no-pycache"
        empty.mkdir(exist_ok=True)
        env.update(PYTHONPYCACHEPREFIX=str(empty), PYTHONDONTWRITEBYTECODE="1")
    return env


def import_time(module: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, cwd=ROOT, check=True)
    return time.perf_counter() - t0


def zips(work: Path) -> dict[str, Path] | None:
    """Spark's pyspark.zip as installed (with bytecode, `make install`) and a copy holding
    its source only, as the pyspark wheel ships it."""
    installed = pyspark_zip()
    if installed is None or not has_bytecode(installed):
        return None
    source_only = work / "source-only" / "pyspark.zip"
    source_only.parent.mkdir()
    with zipfile.ZipFile(installed) as old, zipfile.ZipFile(source_only, "w") as new:
        for info in old.infolist():
            if not info.filename.endswith(".pyc"):
                new.writestr(info, old.read(info))
    return {"bytecode": installed, "none": source_only}


def zip_import_time(spark_zip: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(spark_zip), "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import pyspark.worker"], env=env, check=True)
    return time.perf_counter() - t0


def add_events(store: str, first: int, count: int) -> None:
    with open_store(store) as opened:
        if not opened.stream_exists("bench/net"):
            opened.create_stream("bench/net", segments=2)
        with opened.writer("bench/net") as writer:
            for i in range(first, first + count):
                payload = json.dumps({"key": f"k{i % 6}", "seq": i}).encode()
                writer.write(payload, routing_key=f"k{i % 6}")


def mirror_life(work: Path, name: str, env: dict[str, str], round_: int, events: int) -> float:
    edge, cloud = f"embedded:{work / name / 'edge'}", f"embedded:{work / name / 'cloud'}"
    add_events(edge, round_ * events, events)
    argv = ["--store", edge, "run", "mirror", "--stream", "bench/net", "--to", "bench/copy"]
    argv += ["--to-store", cloud, "--max-events", "25"]
    argv += ["--checkpoint", str(work / name / "checkpoint")]
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *argv],
        env=env,
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=45)
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-bytecode-"))
    envs = {"bytecode": environment(work, True), "none": environment(work, False)}
    imports: dict[tuple[str, str], list[float]] = {}
    spark_zips = zips(work)
    lives: dict[str, list[float]] = {name: [] for name in envs}
    for n in range(args.rounds):
        order = list(envs) if n % 2 == 0 else list(envs)[::-1]
        for module in MODULES:
            for name in order:
                imports.setdefault((module, name), []).append(import_time(module, envs[name]))
        for name in order if spark_zips else ():
            imports.setdefault(("zip", name), []).append(zip_import_time(spark_zips[name]))
        for name in order:
            lives[name].append(mirror_life(work, name, envs[name], n, args.events))
            print(f"round {n} {name:<9} mirror driver {lives[name][-1]:6.2f} s", flush=True)

    figures = []
    for module in MODULES:
        with_, without = (statistics.median(imports[module, name]) for name in envs)
        print(f"import {module}: {with_:.2f} s with bytecode, {without:.2f} s without")
        figures.append(Figure(f"python -c 'import {module}'", "s", with_, without, "no bytecode"))
    if spark_zips:
        with_, without = (statistics.median(imports["zip", name]) for name in envs)
        print(
            f"import pyspark.worker from pyspark.zip: {with_:.2f} s with, {without:.2f} s without"
        )
        what = "import pyspark.worker from pyspark.zip, as Spark's Python processes do"
        figures.append(Figure(what, "s", with_, without, "the zip as pyspark ships it"))
    with_, without = (statistics.median(lives[name]) for name in envs)
    print(f"sluice run mirror ({args.events} events): {with_:.1f} s with, {without:.1f} s without")
    what = f"one `sluice run mirror` driver, {args.events} new events in batches of 25"
    figures.append(Figure(what, "s", with_, without, "no bytecode"))
    if args.write_results:
        print(f"wrote {recorder.write(figures)}")


if __name__ == "__main__":
    main()
