"""Run a `sluice run …` job as a separate driver process and SIGKILL it at random points.

A driver crash is the whole driver going away at once: the Python process, its JVM and the
JVM's Python workers. The job runs in its own process group and the group gets SIGKILL, so
no piece of the old driver keeps committing while the next one starts.

Kill points: half anywhere from start-up to the end of the life's first batch (planning,
the replay of a batch the previous life left unfinished, its tasks and commit), half at a
random moment after the first batch was reported (in the middle of later batches: reading,
writing transactions or files, recording the intent, committing, marking done). Both windows
are learned from the lives so far (`Aim`), so that a kill lands inside a life instead of after
its end: a life that finishes before its kill point is a whole driver run that kills nothing.

A job with named crash points (the streaming join's `SLUICE_TEST_JOIN_FAILPOINTS`) kills itself
there instead: `died_at_failpoint` waits for that and sweeps up the rest of its process group.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: A quicker JVM start for many short-lived drivers (C1 only, serial GC); tests only.
FAST_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto"


def job_env(home: Path) -> dict[str, str]:
    config = home / "sluice.toml"
    home.mkdir(parents=True, exist_ok=True)
    config.write_text(
        '[spark]\nmaster = "local[2]"\n'
        f'[spark.conf]\n"spark.driver.extraJavaOptions" = "{FAST_JVM}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env.update(
        SLUICE_HOME=str(home),
        SLUICE_CONFIG=str(config),
        SLUICE_SPARK_MASTER="local[2]",
        PYTHONPATH=str(ROOT),
    )
    env.pop("SLUICE_STORE", None)
    return env


@dataclass
class Life:
    """One driver process: when it started and when it reported its first batch."""

    proc: subprocess.Popen
    started: float
    first_batch: threading.Event = field(default_factory=threading.Event)
    first_batch_after: float | None = None
    stderr: list[str] = field(default_factory=list)

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode(errors="replace")
            self.stderr.append(line)
            if " batch " in line and not self.first_batch.is_set():
                self.first_batch_after = time.monotonic() - self.started
                self.first_batch.set()

    def tail(self) -> str:
        return "".join(self.stderr[-40:])

    def reported_a_batch(self, timeout: float) -> bool:
        """Wait for the first batch's report; False at once if the process ended without one."""
        deadline = time.monotonic() + timeout
        while not self.first_batch.wait(timeout=0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return self.first_batch.is_set()
        return True


def start(argv: list[str], env: dict[str, str]) -> Life:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *argv],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    life = Life(proc, time.monotonic())
    threading.Thread(target=life._pump, daemon=True).start()
    return life


def kill(life: Life) -> None:
    os.killpg(life.proc.pid, signal.SIGKILL)
    life.proc.wait()


@dataclass
class Aim:
    """What the lives so far say about this machine: seconds from a driver's start to its
    first batch's report, and how long a driver that was not killed ran after that report."""

    startup: float = 15.0
    tail: float = 2.5

    def learn(self, life: Life, killed: bool) -> None:
        ended = time.monotonic() - life.started
        if life.first_batch_after is None:
            if killed:  # before its first batch: a first batch takes at least this long
                self.startup = min(30.0, max(self.startup, ended))
            return
        # later kills aim at the start-up time this machine shows
        self.startup = min(30.0, max(3.0, 0.5 * self.startup + 0.5 * life.first_batch_after))
        if not killed:  # it ran to its end: later kills after a first batch aim before that
            self.tail = max(0.3, min(self.tail, 0.8 * (ended - life.first_batch_after)))


def kill_at_random(life: Life, rng: random.Random, aim: Aim) -> bool:
    """Kill the driver at a random point; False if it finished (caught up) first."""
    if rng.random() < 0.5:  # anywhere up to the end of the first batch: start-up, replays
        deadline = life.started + rng.uniform(0.5, aim.startup)
    else:
        life.first_batch.wait(timeout=aim.startup * 4)
        deadline = time.monotonic() + rng.uniform(0.0, aim.tail)
    while time.monotonic() < deadline:
        if life.proc.poll() is not None:
            return False
        time.sleep(0.02)
    if life.proc.poll() is not None:
        return False
    kill(life)
    return True


def without_batch_limit(argv: list[str]) -> list[str]:
    """The same command in one batch: the last life only has to finish the backlog."""
    if "--max-events" not in argv:
        return argv
    at = argv.index("--max-events")
    return argv[:at] + argv[at + 2 :]


def run_to_completion(argv: list[str], env: dict[str, str], timeout: float = 240) -> Life:
    life = start(argv, env)
    try:
        code = life.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(life)
        raise
    time.sleep(0.1)  # let the pump thread take the last lines
    assert code == 0, life.tail()
    return life


def kill_loop(
    argv: list[str],
    env: dict[str, str],
    kills: int,
    before_each_life,  # callable(life_number) -> None: adds work so every life has some
    seed: int | None = None,
) -> int:
    """Start, kill, restart `kills` times; return the number of lives that were killed."""
    rng, aim = random.Random(seed), Aim()
    killed = lives = 0
    while killed < kills:
        before_each_life(lives)
        life = start(argv, env)
        if kill_at_random(life, rng, aim):
            killed += 1
            aim.learn(life, killed=True)
        else:
            assert life.proc.returncode == 0, life.tail()
            # it ran batches, so the pump sees a first batch line: wait for it (not for the
            # pipe's end, which the JVM, still stopping after the driver, holds open)
            life.first_batch.wait(timeout=10)
            aim.learn(life, killed=False)
        lives += 1
        if lives > kills * 3:
            msg = f"only {killed} of {lives} lives could be killed: the job ends too fast"
            raise AssertionError(msg)
    return killed


def died_at_failpoint(life: Life, name: str, timeout: float = 180) -> bool:
    """Wait for the driver to SIGKILL itself at the failpoint `name` (it says `failpoint NAME:
    SIGKILL` first), then SIGKILL whatever is left of its process group. False if the driver
    ended another way, or was still running after `timeout` s (it is killed then)."""
    try:
        code = life.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill(life)
        return False
    with contextlib.suppress(ProcessLookupError):  # the driver took its group with it
        os.killpg(life.proc.pid, signal.SIGKILL)
    time.sleep(0.1)  # let the pump thread take the last lines
    return code == -signal.SIGKILL and f"failpoint {name}: SIGKILL" in "".join(life.stderr)
