"""Catch-ups with nothing new: decided from the checkpoint and the store, beside Spark's way.

    .venv/bin/python benchmarks/noop.py [--events 200] [--repeat 3]

NIC events go to the edge stream of the repository's sluice.toml (family `network`, under a
temporary SLUICE_HOME); one Dagster catch-up (mirror, exports, slices) and one `sluice run
export` bring every checkpoint to the tail. Then each contender runs again with nothing new,
each in a new process, as a scheduler starts them, in alternating order:

1. `sluice run export` (the `--available-now` default): the shortcut;
2. the same command through Spark: `runner._standing` does not say where the checkpoint
   stands, which is how every run went before the shortcut (the JVM starts, the query plans
   no batch, stops; checked: that process imported pyspark);
3. the Dagster catch-up job (`catch_up_network`, in process on an ephemeral instance);
4. the same job through Spark.

Every run is checked to have found nothing (no batch, no materialization), and the
shortcut's to have imported no pyspark, before figures print: wall seconds of each process
(and of the Dagster run inside it), medians, and the ratio Spark / shortcut."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FAMILY = "network"
T0 = 1_800_000_000_000_000_000

#: Runs the command or the Dagster job; argv[1] says which, argv[2] whether through Spark.
CHILD = """
import json, sys, time
started = time.perf_counter()
what, through_spark, argv = sys.argv[1], sys.argv[2] == "spark", json.loads(sys.argv[3])
if through_spark:
    import pipeline.jobs.runner as runner
    runner._standing = lambda *args, **kwargs: None  # unknown: every run before the shortcut
if what == "command":
    import contextlib, io
    from pipeline.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    summary = json.loads(out.getvalue())
    found = {"code": code, "batches": summary["batches"], "events": summary["events"]}
else:
    import dagster as dg
    from assets.definitions import build_definitions
    from pipeline.settings import load_settings
    job = build_definitions(load_settings(__import__("pathlib").Path(argv[0]))).resolve_job_def(
        argv[1]
    )
    with dg.DagsterInstance.ephemeral() as instance:
        begun = time.perf_counter()
        result = job.execute_in_process(instance=instance)
        run_s = time.perf_counter() - begun
    found = {
        "code": 0 if result.success else 1,
        "run_s": run_s,
        "materialized": sorted(
            e.event_specific_data.materialization.asset_key.to_user_string()
            for e in result.all_events if e.event_type_value == "ASSET_MATERIALIZATION"
        ),
    }
found["pyspark"] = "pyspark" in sys.modules
found["process_s"] = time.perf_counter() - started
print(json.dumps(found))
"""


def nic_event(i: int, samples: int = 100) -> bytes:
    """One NetworkSamples event of `samples` samples, 10 ms apart."""
    first = T0 + i * samples * 10_000_000
    event = {
        "RemoteAddr": "bench",
        "Interface": "eth0",
        "TimestampNanos": [first + k * 10_000_000 for k in range(samples)],
        "RxBytes": [i * samples + k for k in range(samples)],
        "TxBytes": [k for k in range(samples)],
    }
    return json.dumps(event).encode()


#: On a loaded machine Spark's Python workers may not connect back in time (the job fails
#: cleanly and its checkpoint is unchanged): such a run is run again, and only a run that
#: finished is timed.
TRANSIENT = "Python worker failed to connect back"


def child(env: dict[str, str], what: str, mode: str, argv: list[str], attempts: int = 3) -> dict:
    command = [sys.executable, "-c", CHILD, what, mode, json.dumps(argv)]
    for attempt in range(attempts):
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - started
        if done.returncode == 0:
            found = json.loads(done.stdout.strip().splitlines()[-1])
            return {**found, "wall_s": wall, "attempts": attempt + 1}
        if TRANSIENT not in done.stderr + done.stdout:
            break
    msg = f"{what} ({mode}) failed:\n{done.stderr[-3000:]}"
    raise SystemExit(msg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200, help="NIC events of 100 samples")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each contender")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as tmp:
        home = Path(tmp) / "home"
        env = {**os.environ, "SLUICE_HOME": str(home), "PYTHONPATH": str(REPO)}
        env.pop("SLUICE_STORE", None)
        os.environ.update(SLUICE_HOME=str(home))
        from pipeline.settings import load_settings
        from pipeline.streams import open_store

        config = REPO / "sluice.toml"
        family = load_settings(config, environ={}, home=home).family(FAMILY)
        with open_store(family.store_uri) as store:
            store.create_stream(family.stream)
            txn = store.begin_transaction(family.stream)
            for i in range(args.events):
                txn.write(nic_event(i), routing_key="bench")
            txn.commit()

        dagster = [str(config), f"catch_up_{FAMILY}"]
        export = ["--store", family.store_uri, "run", "export", "--stream", family.stream]
        export += ["--schema", family.schema, "--output", "exports/cli"]
        first = child(env, "dagster", "spark", dagster)
        if len(first["materialized"]) < 3:
            msg = f"the first catch-up materialized {first['materialized']}"
            raise SystemExit(msg)
        if child(env, "command", "spark", export)["events"] != args.events:
            msg = "the first export did not export every event"
            raise SystemExit(msg)

        contenders = {
            ("command", "shortcut"): export,
            ("command", "spark"): export,
            ("dagster", "shortcut"): dagster,
            ("dagster", "spark"): dagster,
        }
        runs: dict[tuple[str, str], list[dict]] = {key: [] for key in contenders}
        for round_ in range(args.repeat):
            order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
            for what, mode in order:
                runs[what, mode].append(child(env, what, mode, contenders[what, mode]))
        check(runs)
        report(runs, args, os.getloadavg())


def check(runs: dict[tuple[str, str], list[dict]]) -> None:
    for (what, mode), found in runs.items():
        for run in found:
            idle = run["code"] == 0 and run.get("batches", 0) == 0 and not run.get("materialized")
            if not idle:
                msg = f"{what} ({mode}) found something to do: {run}"
                raise SystemExit(msg)
            if run["pyspark"] != (mode == "spark"):  # the peer must really go through Spark
                did = "imported" if run["pyspark"] else "did not import"
                msg = f"{what} ({mode}) {did} pyspark"
                raise SystemExit(msg)


def report(runs: dict[tuple[str, str], list[dict]], args: argparse.Namespace, load) -> None:
    def median(what: str, mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[what, mode])

    print(
        f"no-op catch-ups: {args.events} events already processed, median of {args.repeat} "
        f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )
    rows = [
        ("sluice run export", "command", "wall_s"),
        ("dagster catch_up_network (process)", "dagster", "wall_s"),
        ("dagster catch_up_network (the run)", "dagster", "run_s"),
    ]
    for name, what, key in rows:
        fast, slow = median(what, "shortcut", key), median(what, "spark", key)
        print(
            f"  {name:<36} shortcut {fast:7.2f} s   through Spark {slow:7.2f} s   "
            f"{slow / fast:5.1f}x"
        )


if __name__ == "__main__":
    main()
