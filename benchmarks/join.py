"""Time-series join: Sluice's vectorized join beside a per-record buffer-and-scan joiner.

    .venv/bin/python benchmarks/join.py [--records 1000000] [--chunk 100]

Two irregularly sampled series are joined by the approach of the Stateful Stream Processor's
LocalStreamBuffer written plainly in Python (computing our pairs, so the work is equal) and
by `join_indices`, `join_tables` and `StreamingJoin`, and the whole `sluice join` command
on Parquet files beside `join_files` in-process; "joins/s" counts output pairs per second,
and the pair sets are checked to be identical first (`benchmarks/README.md`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.timejoin import StreamingJoin, join_files, join_indices, join_tables

REPO = Path(__file__).resolve().parents[1]


class BufferAndScanJoin:
    """Per-record joiner: buffer each arrival, then sweep the buffers in time order while both
    series have passed the sweep point, keeping each series' pending records (awaiting a
    successor) and last group (a predecessor for the next records of the other series)."""

    def __init__(self, max_gap: float | None = None) -> None:
        self.max_gap = max_gap
        self.buffers = {"left": deque(), "right": deque()}
        self.latest = {"left": -math.inf, "right": -math.inf}
        self.ended = {"left": False, "right": False}
        self.pending = {"left": [], "right": []}
        self.last = {"left": [], "right": []}
        self.out: list[tuple[int, int]] = []

    def ingest(self, side: str, t: float, index: int) -> None:
        self.buffers[side].append((t, index))
        self.latest[side] = t
        self._scan()

    def end(self, side: str) -> None:
        self.ended[side] = True
        self._scan()

    def _scan(self) -> None:
        horizon = min(math.inf if self.ended[s] else self.latest[s] for s in ("left", "right"))
        left, right = self.buffers["left"], self.buffers["right"]
        while True:
            t = min(left[0][0] if left else math.inf, right[0][0] if right else math.inf)
            if t >= horizon:
                return
            lg = self._pop_group(left, t)
            rg = self._pop_group(right, t)
            self._step(lg, rg)

    @staticmethod
    def _pop_group(buffer: deque, t: float) -> list[tuple[float, int]]:
        group = []
        while buffer and buffer[0][0] == t:
            group.append(buffer.popleft())
        return group

    def _step(self, lg: list, rg: list) -> None:
        pend_l, pend_r = self.pending["left"], self.pending["right"]
        if lg and rg:
            self._emit(lg, rg)
        if rg:
            self._emit(pend_l, rg)
            if not lg and not pend_l:
                self._emit(self.last["left"], rg)
        if lg:
            self._emit(lg, pend_r)
            if not rg and not pend_r:
                self._emit(lg, self.last["right"])
        self.pending["left"] = [] if rg else pend_l + lg
        self.pending["right"] = [] if lg else pend_r + rg
        self.last["left"] = lg or self.last["left"]
        self.last["right"] = rg or self.last["right"]

    def _emit(self, lefts: list, rights: list) -> None:
        for tl, li in lefts:
            for tr, ri in rights:
                if self.max_gap is None or abs(tl - tr) <= self.max_gap:
                    self.out.append((li, ri))


def make_series(n: int, seed: int) -> tuple[np.ndarray, pa.Table]:
    rng = np.random.default_rng(seed)
    times = 1.7e9 + np.cumsum(rng.exponential(0.001, n))
    table = pa.table({"time": times, "value": rng.normal(size=n), "seq": np.arange(n)})
    return times, table


def arrival_order(n: int, chunk: int) -> list[tuple[str, int, int]]:
    """Alternating chunks of the two series: (side, start, stop)."""
    steps = []
    for start in range(0, n, chunk):
        steps.append(("left", start, min(n, start + chunk)))
        steps.append(("right", start, min(n, start + chunk)))
    return steps


def run_baseline(lt, rt, steps, max_gap):
    joiner = BufferAndScanJoin(max_gap)
    lt_list, rt_list = lt.tolist(), rt.tolist()
    start = time.perf_counter()
    for side, a, b in steps:
        ts = lt_list if side == "left" else rt_list
        for i in range(a, b):
            joiner.ingest(side, ts[i], i)
    joiner.end("left")
    joiner.end("right")
    elapsed = time.perf_counter() - start
    return np.array(joiner.out, dtype=np.int64).reshape(-1, 2), elapsed


def run_streaming(left, right, n, batch, max_gap):
    joiner = StreamingJoin(max_gap=max_gap)
    start = time.perf_counter()
    rows = 0
    for side, a, b in arrival_order(n, batch):
        out = joiner.push(side, (left if side == "left" else right).slice(a, b - a))
        rows += out.num_rows if out is not None else 0
    for side in ("left", "right"):
        out = joiner.end(side)
        rows += out.num_rows if out is not None else 0
    return rows, time.perf_counter() - start


def command_env(pycache: Path) -> dict[str, str]:
    """The environment of a `sluice join` process: this checkout's `pipeline`, and a bytecode
    cache (in `pycache`), as an installed Sluice has, even where PYTHONDONTWRITEBYTECODE is set."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    path = [str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    return {**env, "PYTHONPATH": os.pathsep.join(path), "PYTHONPYCACHEPREFIX": str(pycache)}


def run_command(folder: Path, max_gap: float | None) -> int:
    """`sluice join left.parquet right.parquet -o out.parquet` as a new process; its pairs."""
    argv = [sys.executable, "-m", "pipeline.cli", "join", "left.parquet", "right.parquet"]
    argv += ["-o", "out.parquet"]
    if max_gap is not None:
        argv += ["--max-gap", repr(max_gap)]
    done = subprocess.run(
        argv, cwd=folder, env=command_env(folder / "pycache"), capture_output=True, check=False
    )
    if done.returncode != 0:
        msg = f"sluice join failed: {done.stderr.decode()[-2000:]}"
        raise SystemExit(msg)
    return int(json.loads(done.stdout)["pairs"])


def run_files(folder: Path, max_gap: float | None) -> int:
    """`join_files` in this process: the command's reading, join and writing, no start-up."""
    out = folder / "in-process.parquet"
    return join_files(folder / "left.parquet", folder / "right.parquet", out, max_gap=max_gap).pairs


def median_of_3(run):
    """The last result and the median wall time of three runs (the baseline runs once: it
    takes long enough that first-run effects are noise for it, not for the fast contenders)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return result, sorted(times)[1]


def pair_keys(left_idx: np.ndarray, right_idx: np.ndarray, n: int) -> np.ndarray:
    return np.sort(left_idx.astype(np.int64) * n + right_idx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records per series")
    parser.add_argument("--chunk", type=int, default=100, help="arrival chunk of the baseline")
    parser.add_argument("--max-gap", type=float, default=None)
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)
    n = args.records
    lt, left = make_series(n, 1)
    rt, right = make_series(n, 2)

    base_pairs, base_s = run_baseline(lt, rt, arrival_order(n, args.chunk), args.max_gap)

    pairs, core_s = median_of_3(lambda: join_indices(lt, rt, args.max_gap))
    result, table_s = median_of_3(lambda: join_tables(left, right, max_gap=args.max_gap))
    stream_rows, stream_s = median_of_3(
        lambda: run_streaming(left, right, n, 10_000, args.max_gap)[0]
    )
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as tmp:
        folder = Path(tmp)
        pq.write_table(left, folder / "left.parquet")
        pq.write_table(right, folder / "right.parquet")
        run_command(folder, args.max_gap)  # writes the bytecode cache, reads the files once
        command_pairs, command_s = median_of_3(lambda: run_command(folder, args.max_gap))
        files_pairs, files_s = median_of_3(lambda: run_files(folder, args.max_gap))
        written = pq.read_metadata(folder / "out.parquet").num_rows

    ours = pair_keys(pairs.left, pairs.right, n)
    if not np.array_equal(ours, pair_keys(base_pairs[:, 0], base_pairs[:, 1], n)):
        msg = "the baseline and Sluice disagree on the pairs: not timing a wrong join"
        raise SystemExit(msg)
    if not (result.pairs == stream_rows == len(ours)):
        msg = "join_tables / StreamingJoin row counts differ from join_indices"
        raise SystemExit(msg)
    if not (command_pairs == files_pairs == written == len(ours)):
        msg = "sluice join / join_files pair counts differ from join_indices"
        raise SystemExit(msg)

    p = len(ours)
    print(f"time-series join: 2 x {n:,} records, {p:,} pairs, max_gap={args.max_gap}")
    rows = [
        ("buffer-and-scan (per record, Python)", base_s),
        ("sluice join_indices (vectorized)", core_s),
        ("sluice join_tables (+ output table)", table_s),
        ("sluice StreamingJoin (10k batches)", stream_s),
        ("sluice join_files (Parquet in and out)", files_s),
        ("sluice join (whole command, new process)", command_s),
    ]
    for name, secs in rows:
        ratio = base_s / secs
        print(f"  {name:<40} {secs:8.3f} s  {p / secs:>14,.0f} joins/s  {ratio:7.1f}x baseline")
    # the Stateful Stream Processor reports ~100,000 records/s for its LocalStreamBuffer
    print(f"  LocalStreamBuffer, as reported: ~100,000/s; join_tables: {p / table_s / 1e5:.1f}x")
    if args.write_results:
        figures = [
            Figure(f"{name}, 2 x {n:,} records", "joins/s", p / secs, p / base_s, rows[0][0])
            for name, secs in rows[1:]
        ]
        print(f"wrote {recorder.write(figures)}")


if __name__ == "__main__":
    main()
