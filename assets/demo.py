"""The Dagster half of `make demo` (`pipeline/demo.py` runs it as a child process).

    python -m assets.demo --until EPOCH_SECONDS --stopped FLAG_FILE --summary out.json

Dagster's own automation runs the pipeline: `dagster-daemon` on Sluice's instance, with every
sensor and schedule of the code location (`workspace.yaml`) turned on, the tail sensor every
5 s and the replay schedule every minute. The edge-tail sensor launches the catch-up runs, the
new-slices sensor the replays, the schedule revalidates a replay (and is turned off after its
first run, which would otherwise come every minute), the automation-condition sensor
refreshes the analytics views. Once the collectors stop (`--stopped` appears) this waits until
that work is done for the final tails, stops the daemon (the processes it started with it)
and writes the summary (runs by launcher, ticks, checks, replays) as JSON for the parent.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from assets.definitions import build_definitions
from assets.instance import sluice_instance
from assets.keys import (
    ANALYTICS_KEY,
    PARTITION_TAG,
    REPLAY_REASON_TAG,
    REVALIDATES_TAG,
    RUN_KEY_TAG,
    SCHEDULE_NAME_TAG,
    SENSOR_NAME_TAG,
    catch_up_job_name,
    nightly_schedule_name,
    replay_job_name,
)
from assets.run_worker import socket_path, start_worker, stop_worker
from assets.sensors import UNFINISHED, views_behind
from pipeline.errors import SluiceError
from pipeline.jobs.slices import list_slices
from pipeline.settings import SluiceSettings, StreamFamily, load_settings
from pipeline.streams import open_store
from pipeline.wording import counted

SUMMARY_VERSION = 2
REPO = Path(__file__).resolve().parents[1]
WORKSPACE = REPO / "workspace.yaml"
#: The demo's pace: the tail sensor every 5 s (the daemon's loop), the schedule every minute.
DEMO_AUTOMATION = {
    "SLUICE_DAGSTER_TAIL_SENSOR_INTERVAL_SECONDS": "5",
    "SLUICE_DAGSTER_REPLAY_SCHEDULE": "* * * * *",
}
POLL_SECONDS = 2.0
#: What a revalidation must reproduce of the replay it checks (besides `metric/*`).
REPRODUCED = (
    "start_cut",
    "end_cut",
    "input_events",
    "input_rows",
    "quarantined",
    "output_rows",
    "model_version",
    "params_hash",
)


class AutomationError(SluiceError):
    """The daemon, or the work the demo waits for, did not do what it should."""

    def __init__(self, reason: str, log: Path) -> None:
        self.reason, self.log = reason, log
        msg = f"{reason} (see {log})"
        super().__init__(msg)


# --- the daemon and turning the automation on ---------------------------------------------


def automation_environ(settings: SluiceSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The daemon's and CLI's environment: this home, its instance, the demo's pace."""
    return {
        **environ,
        **DEMO_AUTOMATION,
        "SLUICE_HOME": str(settings.home),
        "DAGSTER_HOME": str(settings.dagster_home),
    }


def dagster_command(name: str) -> str:
    return str(Path(sys.executable).parent / name)


class Daemon:
    """`dagster-daemon run` in a process group of its own, which the code servers it starts
    and the runs they launch join. Stopping the daemon lets a launched run finish (it runs
    under its code server); stopping the group ends everything that is left."""

    def __init__(self, env: Mapping[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [dagster_command("dagster-daemon"), "run", "-w", str(WORKSPACE)],
                cwd=REPO,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            msg = f"dagster-daemon exited with {self.proc.returncode}"
            raise AutomationError(msg, self.log)

    def stop(self, grace_seconds: float = 60.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop_group(self, grace_seconds: float = 30.0) -> None:
        """SIGTERM to what is left of the group, SIGKILL after `grace_seconds`."""
        self.stop()
        for sig, wait in ((signal.SIGTERM, grace_seconds), (signal.SIGKILL, 10.0)):
            if not self._group_alive():
                return
            os.killpg(self.proc.pid, sig)
            deadline = time.monotonic() + wait
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.2)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


@contextmanager
def daemon_running(env: Mapping[str, str], log: Path) -> Iterator[Daemon]:
    daemon = Daemon(env, log)
    try:
        yield daemon
    finally:
        daemon.stop_group()


@contextmanager
def run_worker_running(env: Mapping[str, str], home: Path, log: Path) -> Iterator[None]:
    """The warm run worker (`assets/run_worker.py`) in a process group of its own, stopped
    with the runs it forked; when it does not start, runs launch through the code server."""
    proc = start_worker(home, log, dict(env))
    try:
        if not socket_path(home).exists():
            print(f"dagster: no warm run worker (see {log}); runs start cold", file=sys.stderr)
        yield
    finally:
        stop_worker(proc)


def turn_on_automation(env: Mapping[str, str], log: Path, timeout: float = 600.0) -> None:
    """`dagster sensor start --start-all` and `dagster schedule start --start-all`, together."""
    commands = [
        [dagster_command("dagster"), kind, "start", "--start-all", "-w", str(WORKSPACE)]
        for kind in ("sensor", "schedule")
    ]
    with log.open("ab") as out:
        procs = [
            subprocess.Popen(
                c,
                cwd=REPO,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # with the code server it starts
            )
            for c in commands
        ]
    try:
        deadline = time.monotonic() + timeout
        for command, proc in zip(commands, procs, strict=True):
            while (code := proc.poll()) is None and time.monotonic() < deadline:
                sleep(0.2)
            if code != 0:
                msg = f"`{' '.join(command[1:4])}` exited with {code}"
                raise AutomationError(msg, log)
    finally:
        for proc in procs:  # on an error or SIGTERM: none is left behind
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


# --- waiting for the automation -----------------------------------------------------------


def final_tails(settings: SluiceSettings) -> dict[str, str]:
    """Each family's edge tail once the collectors have stopped (what the sensor must reach)."""
    tails = {}
    for family in settings.streams:
        with open_store(family.store_uri) as store:
            tails[family.name] = store.tail(family.stream).text
    return tails


class DemoAutomation:
    """What the demo waits for, read from the instance: runs, their tags, materializations."""

    def __init__(self, settings: SluiceSettings, instance: dg.DagsterInstance, log: Path) -> None:
        self.settings, self.instance, self.log = settings, instance, log
        self.started = datetime.now(UTC)
        graph = build_definitions(settings).resolve_asset_graph()
        self.analytics_inputs = sorted(graph.get(ANALYTICS_KEY).parent_keys)
        self.replayed = [f for f in settings.streams if f.models and f.bookmark is not None]

    def runs(self, **filters: Any) -> list[dg.DagsterRun]:
        """This demo's runs (the instance keeps earlier demos' too), oldest first."""
        found = self.instance.get_run_records(
            dg.RunsFilter(created_after=self.started, **filters), ascending=True
        )
        return [r.dagster_run for r in found]

    def finished(self, **filters: Any) -> bool:
        runs = self.runs(**filters)
        return bool(runs) and all(r.is_finished for r in runs)

    def slice_ids(self, family: StreamFamily) -> list[str]:
        assert family.bookmark is not None
        with open_store(family.mirror_store_uri) as store:
            if not store.stream_exists(family.bookmark.slices_stream):
                return []
            records = list_slices(store, family.mirror_stream, family.bookmark.slices_stream)
        return [r.slice_id for r in records]

    def pending(self, tails: Mapping[str, str]) -> list[str]:
        """What the automation has still to do for the final `tails`; empty once done."""
        todo = []
        for family in self.settings.streams:
            key = f"{catch_up_job_name(family)}:{tails[family.name]}"
            if not self.finished(tags={RUN_KEY_TAG: key}):
                todo.append(f"{family.name}: the catch-up to its final tail")
        if todo:
            return todo  # the slices are not final yet
        for family in self.replayed:
            ids = self.slice_ids(family)
            job = replay_job_name(family)
            waiting = [i for i in ids if not self.finished(job_name=job, tags={PARTITION_TAG: i})]
            if waiting:
                todo.append(f"{family.name}: replays of {len(waiting)} slices")
            elif ids and not self.finished(tags=revalidation_tags(family)):
                todo.append(f"{nightly_schedule_name(family)}: a revalidation")
        if not todo and not self.analytics_current():
            todo.append("the analytics views: a refresh after the last upstream change")
        unfinished = self.runs(statuses=UNFINISHED)
        if not todo and unfinished:
            todo.append(f"{counted(len(unfinished), 'run')} still running")
        return todo

    def analytics_current(self) -> bool:
        """The views' latest refresh started after their newest input: the sensor's rule."""
        return views_behind(self.instance, ANALYTICS_KEY, self.analytics_inputs) is None

    def stop_schedules_that_ran(self) -> None:
        """The demo's schedule ticks every minute: once it has launched a revalidation, turn
        it off (a tick that raced the new-slices sensor may have replayed a slice first)."""
        tags = {nightly_schedule_name(f): revalidation_tags(f) for f in self.replayed}
        for state in self.instance.all_instigator_state():
            name = state.instigator_name
            if name in tags and state.is_running and self.runs(tags=tags[name]):
                self.instance.stop_schedule(state.instigator_origin_id, state.selector_id, None)

    def settle(self, daemon: Daemon, tails: Mapping[str, str], timeout: float) -> None:
        deadline, last = time.monotonic() + timeout, None
        while todo := self.pending(tails):
            daemon.check_alive()
            self.stop_schedules_that_ran()
            if todo != last:
                print(f"dagster: waiting for {'; '.join(todo)}", file=sys.stderr, flush=True)
                last = todo
            if time.monotonic() > deadline:
                reason = f"after {timeout:.0f}s the automation still had to do: {'; '.join(todo)}"
                raise AutomationError(reason, daemon.log)
            sleep(POLL_SECONDS)
        self.stop_schedules_that_ran()

    def wait_for_runs(self, timeout: float) -> None:
        """Runs a last tick launched before the daemon stopped run to their end."""
        deadline = time.monotonic() + timeout
        while unfinished := self.runs(statuses=UNFINISHED):
            if time.monotonic() > deadline:
                ids = ", ".join(r.run_id[:8] for r in unfinished)
                msg = f"runs {ids} did not finish in {timeout:.0f}s"
                raise AutomationError(msg, self.log)
            sleep(POLL_SECONDS)

    # --- the summary ---------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        runs = self.runs()
        return {
            "version": SUMMARY_VERSION,
            "dagster_home": str(self.settings.dagster_home),
            "automation": {k: DEMO_AUTOMATION[k] for k in sorted(DEMO_AUTOMATION)},
            "runs": [run_entry(r) for r in runs],
            "launchers": self.launchers(runs),
            "checks": self.checks(runs),
            "replays": self.replays(runs),
            "revalidations": self.revalidations(runs),
        }

    def launchers(self, runs: list[dg.DagsterRun]) -> list[dict[str, Any]]:
        """Every sensor and schedule: on or off now, its ticks in this demo, its runs."""
        found = []
        for state in sorted(self.instance.all_instigator_state(), key=lambda s: s.instigator_name):
            kind = state.instigator_type.value.lower()
            ticks = self.instance.get_ticks(
                state.instigator_origin_id, state.selector_id, after=self.started.timestamp()
            )
            name = f"{kind} {state.instigator_name}"
            found.append(
                {
                    "kind": kind,
                    "name": state.instigator_name,
                    "running": state.is_running,
                    "ticks": dict(Counter(tick.status.value.lower() for tick in ticks)),
                    "runs": [r.run_id for r in runs if launcher(r.tags) == name],
                }
            )
        return found

    def events(self, run_id: str, kind: dg.DagsterEventType) -> list[Any]:
        return list(self.instance.all_logs(run_id, of_type=kind))

    def checks(self, runs: list[dg.DagsterRun]) -> dict[str, bool]:
        """The latest evaluation of every asset check."""
        found: dict[str, bool] = {}
        for run in runs:
            for entry in self.events(run.run_id, dg.DagsterEventType.ASSET_CHECK_EVALUATION):
                data = entry.dagster_event.event_specific_data
                found[f"{data.asset_key.to_user_string()}:{data.check_name}"] = bool(data.passed)
        return found

    def materializations(self, run_id: str) -> list[dict[str, Any]]:
        found = []
        for entry in self.events(run_id, dg.DagsterEventType.ASSET_MATERIALIZATION):
            mat = entry.asset_materialization
            meta = {k: v.value for k, v in mat.metadata.items() if not k.startswith("dagster/")}
            found.append({"asset": mat.asset_key.to_user_string(), "dagster_run": run_id, **meta})
        return [jsonable(m) for m in found]

    def replays(self, runs: list[dg.DagsterRun]) -> list[dict[str, Any]]:
        """Per replay asset and slice, its first replay in this demo."""
        jobs = {replay_job_name(f) for f in self.replayed}
        first: dict[tuple[str, str], dict[str, Any]] = {}
        for run in runs:
            if run.job_name in jobs:
                for m in self.materializations(run.run_id):
                    first.setdefault((m["asset"], m.get("slice_id", "")), m)
        return list(first.values())

    def revalidations(self, runs: list[dg.DagsterRun]) -> list[dict[str, Any]]:
        """Each revalidation against the replay it checked: what it reproduced, what not."""
        found = []
        for run in runs:
            if run.tags.get(REPLAY_REASON_TAG) != "revalidate":
                continue
            checked = run.tags.get(REVALIDATES_TAG, "")
            earlier = {m["asset"]: m for m in self.materializations(checked)} if checked else {}
            for again in self.materializations(run.run_id):
                before = earlier.get(again["asset"], {})
                keys = [*REPRODUCED, *sorted(k for k in again if k.startswith("metric/"))]
                pairs = {k: [before.get(k), again.get(k)] for k in keys}
                found.append(
                    {
                        "asset": again["asset"],
                        "slice_id": again.get("slice_id"),
                        "run_id": run.run_id,
                        "revalidates": checked,
                        "compared": bool(before),
                        "differences": {k: ab for k, ab in pairs.items() if ab[0] != ab[1]},
                    }
                )
        return found


def revalidation_tags(family: StreamFamily) -> dict[str, str]:
    return {SCHEDULE_NAME_TAG: nightly_schedule_name(family), REPLAY_REASON_TAG: "revalidate"}


def launcher(tags: Mapping[str, str]) -> str:
    """Who launched a run: `sensor NAME`, `schedule NAME`, or `manual`."""
    if SENSOR_NAME_TAG in tags:
        return f"sensor {tags[SENSOR_NAME_TAG]}"
    if SCHEDULE_NAME_TAG in tags:
        return f"schedule {tags[SCHEDULE_NAME_TAG]}"
    return "manual"


def run_entry(run: dg.DagsterRun) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "job": run.job_name,
        "status": run.status.value,
        "success": run.is_success,
        "launched_by": launcher(run.tags),
        "partition": run.tags.get(PARTITION_TAG),
        "assets": sorted(k.to_user_string() for k in run.asset_selection or ()),
        "reason": run.tags.get(REPLAY_REASON_TAG),
    }


def jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v if isinstance(v, str | int | float | bool | None) else str(v)
        for k, v in values.items()
    }


def wait_for(flag: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not flag.exists():
        if time.monotonic() > deadline:
            msg = f"the collectors did not stop within {timeout:.0f}s ({flag} never appeared)"
            raise TimeoutError(msg)
        sleep(0.2)


#: Set by SIGTERM (the demo stopping early, `pipeline/demo.py`) and acted on where the
#: automation waits (`check_stop`), never in the middle of a Dagster call: a `SystemExit`
#: raised by the handler itself was swallowed there once, leaving the worker and its runs
_stop = threading.Event()


def _note_sigterm(signum: int, frame: object) -> None:
    _stop.set()


def check_stop() -> None:
    """Leave (`SystemExit`: the daemon and the worker are stopped on the way out) once a
    SIGTERM came."""
    if _stop.is_set():
        raise SystemExit(128 + signal.SIGTERM)


def sleep(seconds: float) -> None:
    """`time.sleep`, cut short by a SIGTERM (`check_stop`)."""
    _stop.wait(seconds)
    check_stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m assets.demo")
    parser.add_argument("--until", type=float, required=True, help="epoch seconds")
    parser.add_argument("--stopped", type=Path, required=True, help="appears when collectors end")
    parser.add_argument("--summary", type=Path, required=True)
    parser.add_argument("--settle-timeout", type=float, default=1500.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _note_sigterm)
    settings = load_settings()
    logs = args.summary.parent
    logs.mkdir(parents=True, exist_ok=True)
    env = automation_environ(settings, os.environ)
    with sluice_instance(settings) as instance:
        demo = DemoAutomation(settings, instance, logs / "daemon.log")
        try:
            check_stop()
            worker = run_worker_running(env, settings.dagster_home, logs / "run-worker.log")
            with worker, daemon_running(env, logs / "daemon.log") as daemon:
                turn_on_automation(env, logs / "automation.log")
                print("dagster: sensors and schedules on", file=sys.stderr, flush=True)
                wait_for(args.stopped, timeout=max(0.0, args.until - time.time()) + 120.0)
                demo.settle(daemon, final_tails(settings), timeout=args.settle_timeout)
                daemon.stop()
                demo.wait_for_runs(timeout=args.settle_timeout)
        finally:  # what the automation did, also when it did not finish
            summary = demo.summary()
            args.summary.write_text(json.dumps(summary, indent=2, default=str))
    return 0 if all(r["success"] for r in summary["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
