"""The Dagster half of `make demo` (`pipeline/demo.py` runs it as a child process).

    python -m assets.demo --until EPOCH_SECONDS --stopped FLAG_FILE --summary out.json

While the collectors run: observe the edge streams and run each family's catch-up job, over
and over. Once they stop (`--stopped` appears): a last catch-up, the slices sensor's decision
and the replays it asks for, then the analytics views. Every run is a job of the code
location on Sluice's instance, in this process (one Spark session), so `make ui` shows them
afterwards; the summary (runs, checks, replays) is JSON for the parent to print.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg

from assets.definitions import build_definitions, build_resources
from assets.instance import sluice_instance
from assets.keys import OBSERVE_EDGE_JOB, REFRESH_ANALYTICS_JOB, catch_up_job_name
from assets.sensors import evaluate_slices
from pipeline.settings import SluiceSettings, load_settings

SUMMARY_VERSION = 1


class DemoRuns:
    """Runs the definitions' jobs on the instance and keeps what the summary needs."""

    def __init__(self, settings: SluiceSettings, instance: dg.DagsterInstance) -> None:
        self.settings = settings
        self.instance = instance
        self.defs = build_definitions(settings)
        self.resources = build_resources(settings)
        self.runs: list[dict[str, Any]] = []
        self.checks: dict[str, bool] = {}
        self.replays: list[dict[str, Any]] = []

    def run(self, job: str, partition_key: str | None = None) -> dg.ExecuteInProcessResult:
        result = self.defs.resolve_job_def(job).execute_in_process(
            instance=self.instance, partition_key=partition_key, raise_on_error=False
        )
        self.runs.append({"job": job, "run_id": result.run_id, "success": result.success})
        for event in result.all_events:
            if event.event_type_value == "ASSET_CHECK_EVALUATION":
                data = event.event_specific_data
                name = f"{data.asset_key.to_user_string()}:{data.check_name}"
                self.checks[name] = bool(data.passed)
        if not result.success:
            failure = next((e.message for e in result.all_events if e.is_failure), "")
            print(f"run {job} failed: {failure}", file=sys.stderr, flush=True)
        return result

    def catch_up(self) -> None:
        self.run(OBSERVE_EDGE_JOB)
        for family in self.settings.streams:
            self.run(catch_up_job_name(family))

    def replay_new_slices(self) -> None:
        families = [f for f in self.settings.streams if f.models]
        context = dg.build_sensor_context(instance=self.instance, resources=self.resources)
        decision = evaluate_slices(context, self.resources["stores"], families)
        for request in decision.dynamic_partitions_requests or ():
            self.instance.add_dynamic_partitions(
                request.partitions_def_name, request.partition_keys
            )
        for request in decision.run_requests:
            result = self.run(request.job_name, partition_key=request.partition_key)
            for event in result.get_asset_materialization_events():
                mat = event.event_specific_data.materialization
                meta = {k: v.value for k, v in mat.metadata.items() if not k.startswith("dagster/")}
                self.replays.append({"asset": mat.asset_key.to_user_string(), **jsonable(meta)})

    def summary(self) -> dict[str, Any]:
        return {
            "version": SUMMARY_VERSION,
            "dagster_home": str(self.settings.dagster_home),
            "runs": self.runs,
            "checks": self.checks,
            "replays": self.replays,
        }


def jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, str | int | float | bool | None) else str(v)
        for k, v in values.items()
    }


def stream_phase(demo: DemoRuns, until: float) -> None:
    rounds = 0
    while rounds == 0 or time.time() < until:
        demo.catch_up()
        rounds += 1
        print(f"dagster: catch-up round {rounds} done", file=sys.stderr, flush=True)


def wait_for(flag: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not flag.exists():
        if time.monotonic() > deadline:
            msg = f"the collectors did not stop within {timeout:.0f}s ({flag} never appeared)"
            raise TimeoutError(msg)
        time.sleep(0.2)


def finish_phase(demo: DemoRuns) -> None:
    demo.catch_up()
    demo.replay_new_slices()
    demo.run(REFRESH_ANALYTICS_JOB)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.demo")
    parser.add_argument("--until", type=float, required=True, help="epoch seconds")
    parser.add_argument("--stopped", type=Path, required=True, help="appears when collectors end")
    parser.add_argument("--summary", type=Path, required=True)
    args = parser.parse_args(argv)
    settings = load_settings()
    with sluice_instance(settings) as instance:
        demo = DemoRuns(settings, instance)
        stream_phase(demo, args.until)
        wait_for(args.stopped, timeout=120.0)
        finish_phase(demo)
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(demo.summary(), indent=2, default=str))
        return 0 if all(r["success"] for r in demo.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
