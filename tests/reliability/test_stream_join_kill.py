"""SIGKILL the streaming join's driver at named points and at random moments; its parts hold
exactly the pairs of one uninterrupted join of the same events, in the same order.

Two streams, one series in each (a routing key; another key's events, going back in time,
beside it), get new events before every life of the driver and while it runs. Each life is
killed once: at one of the join's failpoints (`pipeline/jobs/stream_join.py`, `FAILPOINTS`:
half of a part file written, a part published and the joiner's state not saved, the state
saved and the batch not committed), on the first or second batch that reaches it, or at a
random moment (`tests/spark/killing.py`). Meanwhile a reader queries the output directory
with DuckDB whenever its files change: every query must succeed (no half-written part), no
pair may appear twice and none may disappear. After the last kill the job runs to the end;
the concatenated parts must then equal one in-process batch over all the events.

`SLUICE_CRASH_SEED=<seed>` replays a run's choices (the seed is printed; the moments of the
timer kills and of the concurrent writes still depend on the machine).
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.jobs.output_claim import CLAIM_FILE
from pipeline.jobs.stream_join import (
    FAILPOINTS,
    FAILPOINTS_ENV,
    SeriesSource,
    StreamJoinSpec,
    process_batch,
)
from pipeline.schemas import flatten_plan
from pipeline.streams import open_store
from tests.jobs.test_bookmark import source_rows
from tests.jobs.test_replay_support import MS, T0, nic_payload
from tests.spark.killing import (
    Aim,
    died_at_failpoint,
    job_env,
    kill_at_random,
    run_to_completion,
    start,
    without_batch_limit,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LEFT, RIGHT = SeriesSource("sensors/left", "m1"), SeriesSource("sensors/right", "m2")
TIMER_KILLS = 1
EVENTS_PER_LIFE = 14  # both sides: with --max-events 3 a life has several batches of pairs
PAUSE = 0.05  # between the reader's looks at the output directory
PAIR = "left__segment, left__offset, left__sample, right__segment, right__offset, right__sample"


class Feeder:
    """Writes sensor events to both streams, each series in time order (random sample steps on
    a 0.1 ms grid, so the two series sometimes share a time), with noise under another key."""

    def __init__(self, uri: str, seed: int) -> None:
        self.rng, self.lock, self.written = random.Random(seed), threading.Lock(), 0
        self.store = open_store(uri)
        self.next_time = {LEFT: T0, RIGHT: T0 + 3 * MS // 10}
        for side in (LEFT, RIGHT):
            self.store.create_stream(side.stream, segments=2)

    def write(self, events: int) -> None:
        with self.lock:
            for _ in range(events):
                self._one()

    def _one(self) -> None:
        # the series that is behind moves more often: both keep making final pairs
        behind = min((LEFT, RIGHT), key=self.next_time.__getitem__)
        side = behind if self.rng.random() < 0.7 else self.rng.choice((LEFT, RIGHT))
        step = self.rng.choice((5, 10, 15)) * MS // 10
        t0 = self.next_time[side] + self.rng.choice((0, 0, 2, 7)) * MS // 10
        rates = [self.rng.randrange(1, 1000) for _ in range(self.rng.randrange(1, 12))]
        payload = nic_payload(side.routing_key, t0, self.written, rates, step_ns=step)
        self.next_time[side] = t0 + len(rates) * step
        with self.store.writer(side.stream) as writer:
            writer.write(payload, routing_key=side.routing_key)
            noise = nic_payload("noise", T0 - self.written * MS, 0, [1], step_ns=MS)
            writer.write(noise, routing_key="noise")
        self.written += 1

    def events(self) -> pa.Table:
        """Every event of both streams, as the `sluice` source's rows."""
        with self.lock:
            return source_rows([*self.store.read(LEFT.stream), *self.store.read(RIGHT.stream)])


class Writing(threading.Thread):
    """Writes an event every 0.1-0.3 s while a driver runs."""

    def __init__(self, feeder: Feeder, seed: int) -> None:
        super().__init__(daemon=True)
        self.feeder, self.pauses, self.stop = feeder, random.Random(seed), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.pauses.uniform(0.1, 0.3)):
            self.feeder.write(1)


def visible(output: Path) -> pa.Table:
    """What a DuckDB reader of the output directory sees, in batch order."""
    query = (
        f"SELECT * EXCLUDE (filename, file_row_number) FROM read_parquet('{output}', "
        "filename = true, file_row_number = true) ORDER BY filename, file_row_number"
    )
    return duckdb.connect().sql(query).to_arrow_table()


def published(output: Path) -> frozenset[tuple[str, int, int]]:
    files = set()
    for path in output.glob("*"):
        try:
            stat = path.stat()
        except FileNotFoundError:  # renamed away between the listing and the stat
            continue
        files.add((path.name, stat.st_ino, stat.st_mtime_ns))
    return frozenset(files)


class Reader(threading.Thread):
    """Queries the output directory with DuckDB each time its files change; records what a
    reader must never see: an unreadable file, a pair twice, fewer pairs than before."""

    def __init__(self, output: Path) -> None:
        super().__init__(daemon=True)
        self.output, self.stop, self.problems = output, threading.Event(), []
        self.queries = self.highest = 0

    def run(self) -> None:
        checked: frozenset = frozenset()
        while not self.stop.wait(PAUSE):
            files = published(self.output)
            if not any(name.endswith(".parquet") for name, _, _ in files) or files == checked:
                continue
            query = f"SELECT count(*), count(DISTINCT ({PAIR})) FROM read_parquet('{self.output}')"
            try:
                [(total, distinct)] = duckdb.connect().execute(query).fetchall()
            except duckdb.IOException as exc:  # a file renamed away during the query
                if "No such file" not in str(exc) and "No files found" not in str(exc):
                    self.problems.append(f"unreadable: {exc}")
                continue
            except duckdb.Error as exc:  # once for these files: they do not change by themselves
                self.problems.append(f"query failed: {exc}")
                checked = files
                continue
            self.queries, checked = self.queries + 1, files
            if total != distinct:
                self.problems.append(f"{total - distinct} pairs visible twice")
            if total < self.highest:
                self.problems.append(f"pairs went from {self.highest} to {total}")
            self.highest = max(self.highest, total)


def pairs(table: pa.Table) -> list[tuple[int, ...]]:
    """Each row's pair: the positions (segment, offset, sample) of its two records."""
    return list(zip(*(table[column].to_pylist() for column in PAIR.split(", ")), strict=True))


def schedule(rng: random.Random) -> list[str | None]:
    """Each failpoint once, at its 1st or 2nd hit in its life, and the timer kills (None)."""
    lives: list[str | None] = [f"{point}:{rng.choice((1, 2))}" for point in FAILPOINTS]
    lives += [None] * TIMER_KILLS
    rng.shuffle(lives)
    return lives


def one_join(events: pa.Table, spec: StreamJoinSpec, root: Path) -> pa.Table:
    """The pairs of one uninterrupted in-process join of `events` (one batch, no Spark)."""
    process_batch(spec, flatten_plan(spec.schema), root / "state", 0, events)
    return pa.concat_tables(pq.read_table(p) for p in sorted(spec.output.glob("part-*")))


def test_stream_join_driver_killed_at_failpoints_and_random_points(tmp_path):
    seed = int(os.environ.get("SLUICE_CRASH_SEED", "0")) or random.randrange(1, 2**31)
    print(f"SLUICE_CRASH_SEED={seed}")
    rng = random.Random(seed)
    uri, output = f"embedded:{tmp_path / 'edge'}", tmp_path / "out"
    feeder = Feeder(uri, seed)
    argv = [
        "--store", uri, "run", "join", "--left", LEFT.text, "--right", RIGHT.text,
        "--schema", "NetworkSamples", "--output", str(output), "--max-events", "3",
        "--checkpoint", str(tmp_path / "ck"),
    ]  # fmt: skip
    env, aim = job_env(tmp_path / "home"), Aim()
    reader, kills = Reader(output), []
    reader.start()
    try:
        for failpoint in schedule(rng):
            feeder.write(EVENTS_PER_LIFE)
            writing = Writing(feeder, rng.randrange(2**31))
            writing.start()
            life = start(argv, env if failpoint is None else env | {FAILPOINTS_ENV: failpoint})
            if failpoint is None:
                killed = kill_at_random(life, rng, aim)
            else:
                killed = died_at_failpoint(life, failpoint.split(":")[0])
                assert killed, f"seed {seed}: {failpoint} not reached:\n{life.tail()}"
            writing.stop.set()
            writing.join()
            assert killed or life.proc.returncode == 0, f"seed {seed}:\n{life.tail()}"
            aim.learn(life, killed)
            lived = time.monotonic() - life.started
            kills.append(f"{failpoint or 'timer'} {'' if killed else '(ended first) '}{lived:.0f}s")
        feeder.write(EVENTS_PER_LIFE)
        run_to_completion(without_batch_limit(argv), env)
    finally:
        reader.stop.set()
        reader.join()

    spec = StreamJoinSpec(LEFT, RIGHT, "NetworkSamples", uri, tmp_path / "reference")
    expected = one_join(feeder.events(), spec, tmp_path)
    print(f"kills: {kills}; {feeder.written} events, {expected.num_rows} pairs")
    assert reader.problems == [], f"seed {seed}: {reader.problems}"
    assert reader.queries > 0
    joined = pa.concat_tables(pq.read_table(p) for p in sorted(output.glob("part-*.parquet")))
    got, want = pairs(joined), pairs(expected)
    wrong = {
        "missing": len(set(want) - set(got)),
        "twice": len(got) - len(set(got)),
        "not a pair": len(set(got) - set(want)),
    }
    assert wrong == dict.fromkeys(wrong, 0), f"seed {seed}: kills {kills}"
    assert got == want, f"seed {seed}: the pairs are in another order; kills {kills}"
    assert joined.equals(expected), f"seed {seed}: the pairs' values differ; kills {kills}"
    assert visible(output).cast(expected.schema).equals(expected), f"seed {seed}: DuckDB"
    left = sorted(
        p.name for p in output.iterdir() if not p.name.startswith("part-") and p.name != CLAIM_FILE
    )
    assert left == [], f"seed {seed}: the last run left the staging files of killed drivers"
