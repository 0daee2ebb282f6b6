"""`sluice run mirror … --continuous` stopped by SIGTERM or Ctrl-C while events flow.

The job runs as a real `sluice` process on embedded stores. The first signal stops it after
the batch in flight: exit 0, the summary on standard output, only Sluice's own lines on
standard error (no py4j traceback), and the checkpoint settled at the last batch reported. A
second signal stops it at once. Either way a later `--available-now` run finishes the rest,
and the target then holds each source event exactly once, in order per key. Both with Spark
in the job's process and attached to a Spark Connect server (`pipeline/jobs/stopping.py`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipeline.jobs.checkpoint import settled_position
from pipeline.spark import connect
from pipeline.spark.session import SparkSettings, spark_conf
from pipeline.streams import open_store
from tests.spark.conftest import fill, per_key_sequences
from tests.spark.killing import ROOT, job_env, run_to_completion

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SOURCE, TARGET = "edge/net", "cloud/net"
BATCH = re.compile(r"^mirror batch \d+")


@dataclass
class Stores:
    edge: str
    cloud: str
    checkpoint: Path

    def mirror(self, *run_flags: str, verbose: bool = False) -> list[str]:
        loudness = ["-v"] if verbose else []
        return [
            *loudness, "--store", self.edge, "run", "mirror", "--stream", SOURCE, "--to", TARGET,
            "--to-store", self.cloud, "--checkpoint", str(self.checkpoint), *run_flags,
        ]  # fmt: skip


@pytest.fixture
def stores(tmp_path) -> Stores:
    edge = f"embedded:{tmp_path / 'edge'}"
    with open_store(edge) as store:
        store.create_stream(SOURCE, segments=2)
    return Stores(edge, f"embedded:{tmp_path / 'cloud'}", tmp_path / "ck")


class Feeder(threading.Thread):
    """Appends ten numbered events to the source every 0.1 s until stopped."""

    def __init__(self, edge: str) -> None:
        super().__init__(daemon=True)
        self.edge, self.done, self.sent = edge, threading.Event(), 0

    def run(self) -> None:
        with open_store(self.edge) as store:
            while not self.done.wait(0.1):
                fill(store, SOURCE, 10, keys=5, first=self.sent)
                self.sent += 10

    def stop(self) -> None:
        self.done.set()
        self.join()


@dataclass
class Job:
    """A `sluice` process in its own process group (a terminal's Ctrl-C reaches the group),
    its standard output and error read as they come."""

    proc: subprocess.Popen[str]
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    pumps: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str]) -> Job:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", *argv],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        job = cls(proc)
        for stream, lines in ((proc.stdout, job.stdout), (proc.stderr, job.stderr)):
            pump = threading.Thread(target=lambda s=stream, out=lines: out.extend(s), daemon=True)
            pump.start()
            job.pumps.append(pump)
        return job

    def batches(self) -> int:
        return sum(1 for line in list(self.stderr) if BATCH.match(line))

    def wait_for_batches(self, count: int, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while self.batches() < count:
            assert self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, f"no {count} batches in {timeout} s\n{self.log()}"
            time.sleep(0.1)

    def end(self, timeout: float = 120) -> tuple[int, dict, str]:
        """The exit code, the summary and standard error, once the process has ended."""
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            self.kill()
        for pump in self.pumps:
            pump.join(timeout=10)
        out = "".join(self.stdout)
        return code, json.loads(out) if code == 0 else {"stdout": out}, self.log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log(self) -> str:
        return "".join(self.stderr)


def in_flight(checkpoint: Path) -> int | None:
    """The batch Spark has planned (`spark/offsets/N`) and not committed yet, if any."""

    def ids(kind: str) -> set[int]:
        folder = checkpoint / "spark" / kind
        return (
            {int(p.name) for p in folder.iterdir() if p.name.isdigit()}
            if folder.is_dir()
            else set()
        )

    planned = ids("offsets") - ids("commits")
    return max(planned) if planned else None


def wait_for_a_batch_in_flight(job: Job, checkpoint: Path, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while (batch := in_flight(checkpoint)) is None:
        assert job.proc.poll() is None, job.log()
        assert time.monotonic() < deadline, f"no batch in flight in {timeout} s\n{job.log()}"
        time.sleep(0.005)
    return batch


def send(job: Job, signum: signal.Signals) -> None:
    if signum == signal.SIGINT:
        os.killpg(job.proc.pid, signum)  # Ctrl-C in a terminal: the whole foreground group
    else:
        job.proc.send_signal(signum)  # `kill -TERM PID`; systemd with KillMode=mixed


def signalled(
    stores: Stores, env: dict[str, str], signum: signal.Signals, *, verbose: bool = False
) -> tuple[int, dict, str, int]:
    """Run the continuous mirror while events flow (more than its batches take: one is
    nearly always in flight), send `signum` once it has reported two batches and a third is
    in flight; return its exit code, summary, standard error and that batch's id."""
    feeder = Feeder(stores.edge)
    feeder.start()
    flags = ("--continuous", "--trigger", "1s", "--max-events", "30")
    job = Job.start(stores.mirror(*flags, verbose=verbose), env)
    try:
        job.wait_for_batches(2)
        batch = wait_for_a_batch_in_flight(job, stores.checkpoint)
        send(job, signum)
        return (*job.end(), batch)
    finally:
        job.kill()
        feeder.stop()


def assert_stopped(code: int, summary: dict, err: str, *, cleanly: bool = True) -> None:
    """Exit 0 and the summary; `cleanly`: nothing on standard error but Sluice's own lines
    (a stop at once kills tasks, and pyspark may then print its accumulator server's EOF)."""
    assert code == 0, err
    assert summary["job"] == "mirror", summary
    assert summary["events"] == sum(r["events"] for r in summary["reports"])
    if cleanly:
        assert "Traceback" not in err, err
        assert "py4j" not in err.lower(), err


def finish_and_assert_each_event_once(stores: Stores, env: dict[str, str], *flags: str) -> None:
    """A run until caught up finishes the rest; the target then holds every source event
    once, in the source's order for each key."""
    run_to_completion(stores.mirror("--available-now", *flags), env)
    with open_store(stores.edge) as source, open_store(stores.cloud) as target:
        sent = [e.payload for e in source.read(SOURCE)]
        copied = [e.payload for e in target.read(TARGET)]
    assert len(copied) == len(set(copied)), "an event was copied twice"
    assert sorted(copied) == sorted(sent), "an event is missing"
    assert per_key_sequences(copied) == per_key_sequences(sent), "events were reordered"


def assert_settled_at_the_last_report(stores: Stores, summary: dict) -> None:
    """Nothing in doubt: Spark committed the last batch it planned, the ledger finished it,
    and it is the last batch the summary reports."""
    settled = settled_position(stores.checkpoint)
    assert settled.batch_id == summary["reports"][-1]["batch_id"]
    assert [cut.text for cut in settled.end_cuts] == [summary["end_cut"]]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_continuous_mirror_after_the_batch_in_flight(tmp_path, stores, signum):
    env = job_env(tmp_path / "home")
    code, summary, err, batch = signalled(stores, env, signum)
    assert_stopped(code, summary, err)
    assert f"{signum.name} received: stopping after the batch in flight" in err
    assert summary["reports"][-1]["batch_id"] >= batch  # it ran to its end, and was reported
    assert_settled_at_the_last_report(stores, summary)
    finish_and_assert_each_event_once(stores, env, "--in-process-bytes", "100000000")


def test_a_second_signal_stops_it_at_once_and_the_next_run_finishes_the_batch(tmp_path, stores):
    """Its first batch copies 200,000 events (seconds): both signals come while it runs."""
    env = job_env(tmp_path / "home")
    with open_store(stores.edge) as store:
        for first in range(0, 200_000, 10_000):
            fill(store, SOURCE, 10_000, keys=5, first=first)
    job = Job.start(stores.mirror("--continuous", "--trigger", "1s"), env)
    try:
        wait_for_a_batch_in_flight(job, stores.checkpoint)
        send(job, signal.SIGTERM)
        time.sleep(0.5)
        send(job, signal.SIGTERM)
        code, summary, err = job.end()
    finally:
        job.kill()
    assert_stopped(code, summary, err, cleanly=False)
    assert "SIGTERM again: stopping the query now" in err
    finish_and_assert_each_event_once(stores, env)


@pytest.fixture
def server(tmp_path):
    """A Spark Connect server for the jobs' SLUICE_HOME, stopped (with its workers) after."""
    home = tmp_path / "home"
    env = job_env(home)
    state = connect.start_server(home, spark_conf(SparkSettings(master="local[2]")))
    try:
        yield env
    finally:
        connect.stop_server(home)
        assert not connect.pid_alive(state.pid)


def test_sigterm_stops_a_mirror_attached_to_spark_connect_after_the_batch_in_flight(stores, server):
    code, summary, err, batch = signalled(stores, server, signal.SIGTERM, verbose=True)
    assert_stopped(code, summary, err)
    assert "attaching to Spark Connect" in err
    assert "SIGTERM received: stopping after the batch in flight" in err
    assert summary["reports"][-1]["batch_id"] >= batch
    assert_settled_at_the_last_report(stores, summary)
    finish_and_assert_each_event_once(stores, server, "--in-process-bytes", "100000000")


def test_sigterm_while_spark_starts_ends_the_run_as_sigterm(tmp_path, stores):
    """Before the query runs there is no batch to finish: the run ends as interrupted, and
    says by which signal (143, as `kill` expects; not Ctrl-C's 130)."""
    job = Job.start(stores.mirror("--in-process-bytes", "0"), job_env(tmp_path / "home"))
    try:
        deadline = time.monotonic() + 60
        while not any("starting Spark" in line for line in list(job.stderr)):
            assert job.proc.poll() is None, job.log()
            assert time.monotonic() < deadline, job.log()
            time.sleep(0.01)
        send(job, signal.SIGTERM)
        code, _, err = job.end()
    finally:
        job.kill()
    assert (code, err.splitlines()[-1]) == (143, "sluice: interrupted by SIGTERM"), err
    assert "Traceback" not in err, err
