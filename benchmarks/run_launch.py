"""A catch-up run launched on Sluice's Dagster instance: forked by the warm run worker vs
spawned by Dagster's code server (its `DefaultRunLauncher`), side by side.

    .venv/bin/python benchmarks/run_launch.py [--rounds 3] [--events 100] [--samples 1000]
                                              [--always-spark] [--connect] [--write-results]

Each contender has its own Sluice home (stores, checkpoints, Dagster instance) and its own
code server started from `workspace.yaml`; the `worker` contender also runs
`python -m assets.run_worker`. Each round appends `events x samples` NIC samples to the
network family's edge stream of both and launches one `catch_up_network` run on each (mirror,
Parquet and CSV exports, their checks), alternating which goes first; the time is from the
launch call to the run's end, as a sensor's launch would see it. By default a round's
backlog is small enough to run in the run's own process, without Spark
(`pipeline/jobs/in_process.py`); `--always-spark` sends every batch through Spark
(`SLUICE_IN_PROCESS_BYTES=0`), and `--connect` (which implies it) runs Spark in a Spark
Connect server both attach to (`pipeline/spark/connect.py`), else each run starts its own
local JVM. Round 0 (new checkpoints: always Spark) is shown but not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from results import Figure, Recorder  # noqa: E402  (benchmarks/results.py, beside this script)
from spark_startup import nic_payload  # noqa: E402

JOB = "catch_up_network"


def append(settings, first: int, events: int, samples: int) -> None:
    from pipeline.streams import open_store

    family = settings.family("network")
    with open_store(family.store_uri) as store:
        if not store.stream_exists(family.stream):
            store.create_stream(family.stream)
        txn = store.begin_transaction(family.stream)
        for i in range(first, first + events):
            txn.write(nic_payload(i, samples), "site-1")
        txn.commit()


class Contender:
    """One Sluice home with its instance, its code server and (maybe) its run worker."""

    def __init__(self, name: str, home: Path, worker: bool, env: dict[str, str]) -> None:
        import dagster as dg
        from dagster._core.workspace.context import WorkspaceProcessContext
        from dagster._core.workspace.load_target import WorkspaceFileTarget

        from assets.instance import prepare_dagster_home
        from pipeline.settings import load_settings

        self.name, self.env = name, {**env, "SLUICE_HOME": str(home)}
        os.environ.update(self.env)  # the code server inherits it
        self.settings = load_settings(ROOT / "sluice.toml", environ=self.env, home=home)
        self.dagster_home = prepare_dagster_home(self.settings.dagster_home)
        self.instance = dg.DagsterInstance.from_config(str(self.dagster_home))
        target = WorkspaceFileTarget(paths=[str(ROOT / "workspace.yaml")])
        self.workspace = WorkspaceProcessContext(self.instance, target)
        self.worker = None
        if worker:
            from assets.run_worker import socket_path, start_worker

            log = home / "run-worker.log"
            self.worker = start_worker(self.dagster_home, log, {**os.environ, **self.env})
            if not socket_path(self.dagster_home).exists():
                msg = f"the run worker did not start: {log.read_text()}"
                raise SystemExit(msg)

    def launch(self) -> tuple[float, float]:
        """Launch a catch-up run and wait for it: (seconds to its end, to its start)."""
        import dagster as dg

        from assets.definitions import build_definitions

        context = self.workspace.create_request_context()
        (repository,) = context.get_code_location("sluice").get_repositories().values()
        remote = repository.get_full_job(JOB)
        job = build_definitions(self.settings).resolve_job_def(JOB)
        run = self.instance.create_run_for_job(
            job_def=job,
            remote_job_origin=remote.get_remote_origin(),
            job_code_origin=remote.get_python_origin(),
        )
        started = time.monotonic()
        self.instance.launch_run(run.run_id, context)
        while not (done := self.instance.get_run_by_id(run.run_id)).is_finished:
            time.sleep(0.05)
        wall = time.monotonic() - started
        if done.status != dg.DagsterRunStatus.SUCCESS:
            msg = f"{self.name}: run {run.run_id} ended {done.status}"
            raise SystemExit(msg)
        record = self.instance.get_run_record_by_id(run.run_id)
        assert record is not None and record.start_time and record.end_time
        return wall, wall - (record.end_time - record.start_time)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.terminate()
            self.worker.wait(timeout=30)
        self.workspace.__exit__(None, None, None)
        self.instance.dispose()


def how_spark_runs(args: argparse.Namespace) -> tuple[str | None, str]:
    """The results' variant for how the runs use Spark, and its words for the figures."""
    if args.connect:
        return "connect", "Spark Connect server"
    if args.always_spark:
        return "always-spark", "a local JVM per run"
    return None, "no Spark (a small backlog runs in the run's process)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--always-spark", action="store_true")
    parser.add_argument("--connect", action="store_true")
    Recorder.add_option(parser)
    args = parser.parse_args()
    variant, spark = how_spark_runs(args)
    recorder = Recorder(__file__, __doc__, variant=variant)

    work = Path(tempfile.mkdtemp(prefix="sluice-bench-launch-"))
    env = {"SLUICE_SPARK_MASTER": "local[2]", "SLUICE_CONFIG": str(ROOT / "sluice.toml")}
    if variant is not None:  # every batch through Spark
        env["SLUICE_IN_PROCESS_BYTES"] = "0"
    server_home = work / "spark"
    if args.connect:
        from pipeline.spark.connect import start_server
        from pipeline.spark.session import SparkSettings, spark_conf

        conf = spark_conf(SparkSettings(master="local[2]", app_name="bench-launch"))
        env["SLUICE_SPARK_REMOTE"] = start_server(server_home, conf).url
    else:
        env["SLUICE_SPARK_REMOTE"] = "local"
    contenders = [
        Contender("code server", work / "cold", worker=False, env=env),
        Contender("run worker", work / "warm", worker=True, env=env),
    ]
    walls: dict[str, list[float]] = {c.name: [] for c in contenders}
    waits: dict[str, list[float]] = {c.name: [] for c in contenders}
    per_round = args.events * args.samples
    try:
        for n in range(args.rounds + 1):
            order = contenders if n % 2 == 0 else contenders[::-1]
            for c in order:
                append(c.settings, n * args.events, args.events, args.samples)
                wall, wait = c.launch()
                print(f"round {n}{'*' if n == 0 else ' '} {c.name:<12} {wall:6.2f} s "
                      f"(until the run started: {wait:5.2f} s)", flush=True)  # fmt: skip
                if n:
                    walls[c.name].append(wall)
                    waits[c.name].append(wait)
    finally:
        for c in contenders:
            c.close()
        if args.connect:
            from pipeline.spark.connect import stop_server

            stop_server(server_home)
    print("(* round 0: new checkpoints; not counted)")
    cold, warm = (statistics.median(walls[c.name]) for c in contenders)
    print(json.dumps({"median_s": {"code server": cold, "run worker": warm}}))
    print(f"catch-up of {per_round:,} new samples ({spark}): run worker {warm:.2f} s, "
          f"code server {cold:.2f} s, {cold / warm:.2f}x")  # fmt: skip
    if args.write_results:
        label = f"catch-up run, {per_round:,} new samples, {spark}"
        figures = [
            Figure(f"{label}: launch to end", "s", warm, cold, "code server", "< 5 s"),
            Figure(
                f"{label}: launch until the run started",
                "s",
                statistics.median(waits["run worker"]),
                statistics.median(waits["code server"]),
                "code server",
            ),
        ]
        print(f"wrote {recorder.write(figures)}")


if __name__ == "__main__":
    main()
