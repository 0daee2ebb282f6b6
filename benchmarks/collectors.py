"""Edge collector: NIC pacing at 1 kHz, and generator throughput through buffer + 2PC.

    .venv/bin/python benchmarks/collectors.py [nic|generator|all] [--seconds 60]
                                              [--samples 5000000] [--interface eth0]
                                              [--load N]

Each runs side by side with a peer in the same run: the NIC collector with a bare Python loop
reading the same counters on the same schedule (`bench_nic`), the generator with raw SQLite
inserts of the same payloads (`bench_generator`). Ratios print last. `--load N` runs the NIC
pair on a busy machine: N processes that spin on the CPU at normal priority (one per core
saturates it) run through both measurements, and the lost samples (ticks the sampler skipped
after a stall, instead of firing a burst) print beside the jitter.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from results import Figure, Recorder  # noqa: E402  (benchmarks/results.py, beside this script)

from collectors.service import run_service  # noqa: E402
from collectors.settings import load_settings  # noqa: E402
from pipeline.failpoints import Failpoints  # noqa: E402
from pipeline.streams import open_store  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

BARE_LOOP = textwrap.dedent(
    """
    import os, sys, time, json
    paths, seconds, priority = sys.argv[1].split(","), float(sys.argv[2]), int(sys.argv[3])
    if priority:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    fds = [os.open(p, os.O_RDONLY) for p in paths]
    stamps, values = [], []
    period, start, k = 0.001, time.monotonic(), 0
    end = start + seconds
    while True:
        k += 1
        due = start + k * period
        left = due - time.monotonic()
        if left > 0:
            time.sleep(left)
        if due > end:
            break
        stamps.append(time.time_ns())
        values.append([int(os.pread(fd, 32, 0)) for fd in fds])
    print(json.dumps(stamps))
    """
)


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and its live children (the NIC sampler process): what the scheduler
    ran them for, to the nanosecond (/proc/PID/schedstat). The user + system times of
    /proc/PID/stat are counted in clock ticks, charged to whoever is running when a tick
    comes: a poor sample of a process that wakes 1000 times a second for a few µs."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = _stat(int(proc.name))
            if int(proc.name) == pid or int(fields[1]) == pid:  # fields[1]: the parent's pid
                total += _ran_for(proc, fields)
        except OSError:
            continue
    return total


def _ran_for(proc: Path, fields: list[str]) -> float:
    """Seconds the process has run: its schedstat, else (no scheduler statistics in this
    kernel) its user + system clock ticks."""
    try:
        return int((proc / "schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


SPINNER = "import time\nwhile True:\n    sum(range(10_000))\n"


class Load:
    """`n` processes spinning on the CPU at normal priority, for as long as the block runs."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> Load:
        self.procs = [subprocess.Popen([sys.executable, "-c", SPINNER]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def interval_stats(stamps: list[int]) -> dict:
    intervals = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    deviation = sorted(abs(i - 1.0) for i in intervals)
    span = (stamps[-1] - stamps[0]) / 1e9
    return {
        "samples": len(stamps),
        # ticks of the span without a sample: skipped after a stall (never a burst)
        "lost": max(0, round(span * 1000) + 1 - len(stamps)),
        "rate_per_s": (len(stamps) - 1) / span,
        "jitter_p50_ms": deviation[len(deviation) // 2],
        "jitter_p99_ms": deviation[int(len(deviation) * 0.99)],
        "jitter_max_ms": deviation[-1],
        "within_1ms_pct": 100.0 * sum(d <= 1.0 for d in deviation) / len(deviation),
        "mean_interval_ms": statistics.fmean(intervals),
    }


def write_config(work: Path, name: str, instance: str) -> Path:
    """A collector.toml with one instance `name` (its settings in `instance`)."""
    path = work / f"{name}.toml"
    head = (
        f'[collector]\nstore = "embedded:{work / name}-streams"\n'
        f'state_dir = "{work / name}-state"\n[instances.{name}]\n'
    )
    path.write_text(head + textwrap.dedent(instance))
    return path


def bench_nic(
    work: Path, interface: str, seconds: float, priority: int, slice_us: int | None
) -> tuple[dict, dict]:
    """`sluice collect` with one NIC instance at 1000 samples/s (1000 samples per event) into an
    embedded store, run as its own process for `seconds` after a warm-up, and read back from
    the stream: achieved rate, sample-interval jitter (|interval - 1 ms|, p50/p99/max), the
    share of intervals within ±1 ms, and the CPU use (user + system) of the collector and its
    sampling process, from /proc. Beside it, in the same run and for as long: a bare Python
    loop reading the same counters at 1 kHz with the same absolute-deadline sleep and nothing
    else (no JSON, no buffer, no store), the floor for sampling from Python. `slice_us` is the
    collector's `sampler_slice_us` (None: its default); the bare loop keeps the kernel's slice."""
    slice_line = "" if slice_us is None else f"sampler_slice_us = {slice_us}"
    store_dir = work / "net1-streams"
    config = write_config(
        work,
        "net1",
        f"""
        driver = "nic"
        stream = "bench/network"
        interface = "{interface}"
        samples_per_sec = 1000
        samples_per_event = 1000
        realtime_priority = {priority}
        {slice_line}
        """,
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(3.0)  # start-up and the first events: not measured
    cpu0, t0_ns, wall0 = cpu_seconds(process.pid), time.time_ns(), time.monotonic()
    time.sleep(seconds)
    cpu1, t1_ns, wall1 = cpu_seconds(process.pid), time.time_ns(), time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    with open_store(f"embedded:{store_dir}") as store:
        stamps = [
            t
            for event in store.read("bench/network")
            for t in json.loads(event.payload)["TimestampNanos"]
            if t0_ns <= t <= t1_ns
        ]
    collector = interval_stats(stamps) | {"cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0)}

    stats_dir = Path("/sys/class/net") / interface / "statistics"
    paths = ",".join(str(stats_dir / n) for n in ("rx_bytes", "tx_bytes"))
    bare = subprocess.Popen(
        [sys.executable, "-c", BARE_LOOP, paths, str(seconds + 1), str(priority)],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    cpu0, wall0 = cpu_seconds(bare.pid), time.monotonic()
    time.sleep(seconds)
    cpu1, wall1 = cpu_seconds(bare.pid), time.monotonic()
    out, _ = bare.communicate(timeout=60)
    bare_stamps = json.loads(out)[500:]
    peer = interval_stats(bare_stamps) | {"cpu_pct": 100 * (cpu1 - cpu0) / (wall1 - wall0)}
    return collector, peer


def events_for(samples: int, per_event: int) -> list[bytes]:
    """The generator's payloads for `samples` samples, as the driver makes them."""
    from collectors.batch import columns_to_events

    payloads = []
    now = time.time_ns()
    for first in range(0, samples, per_event):
        seq = range(first, first + per_event)
        columns = {
            "TimestampNanos": [now + i for i in seq],
            "Sequence": list(seq),
            "Value": [s * 37 % 1000 for s in seq],
        }
        payloads += [e.payload for e in columns_to_events(columns, {"Sensor": "g"}, "k")]
    return payloads


def bench_sqlite(work: Path, samples: int, per_event: int) -> dict:
    payloads = events_for(samples, per_event)
    conn = sqlite3.connect(work / "raw.db", isolation_level=None)
    conn.execute("PRAGMA page_size = 65536")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB)")
    started = time.perf_counter()
    for i in range(0, len(payloads), 64):
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO events (payload) VALUES (?)", [(p,) for p in payloads[i : i + 64]]
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return {"samples": samples, "seconds": elapsed, "samples_per_s": samples / elapsed}


def bench_generator(work: Path, samples: int, per_event: int) -> dict:
    """A generator instance with no pacing (`samples_per_sec` = 1e9), `per_event` samples per
    event, `samples` samples, through the SQLite buffer and the two-phase commit into an
    embedded store, until every sample is committed; checked complete and in order. Its peer
    is `bench_sqlite`: the raw insert rate of the same payloads with the buffer's settings
    (WAL, synchronous=FULL, 64 events per commit), the ceiling for any buffer on this disk."""
    store_dir = work / "gen-streams"
    config_path = write_config(
        work,
        "gen",
        f"""
        driver = "generator"
        stream = "bench/generated"
        samples_per_sec = 1e9
        samples_per_event = {per_event}
        max_samples = {samples}
        """,
    )
    settings = load_settings(config_path, {}, "unused", work)
    cpu0, started = time.process_time(), time.perf_counter()
    run_service(settings, Failpoints(), threading.Event(), install_signals=False)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu0
    with open_store(f"embedded:{store_dir}") as store:
        seen = 0
        for event in store.read("bench/generated"):
            sequence = json.loads(event.payload)["Sequence"]
            assert sequence[0] == seen and sequence[-1] == seen + len(sequence) - 1
            seen += len(sequence)
    assert seen == samples, f"{seen} of {samples} samples in the stream"
    return {
        "samples": samples,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "cpu_seconds": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("which", nargs="?", default="all", choices=("nic", "generator", "all"))
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--samples", type=int, default=5_000_000)
    parser.add_argument(
        "--realtime-priority",
        type=int,
        default=0,
        help="SCHED_FIFO priority of the sampling thread (collector and bare loop alike)",
    )
    parser.add_argument(
        "--sampler-slice-us",
        type=int,
        help="the collector's nic.sampler_slice_us (default: the driver's; 0: the kernel's)",
    )
    parser.add_argument(
        "--interface", default="eth0" if Path("/sys/class/net/eth0").exists() else "lo"
    )
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        help="CPU-spinning processes that run through the NIC measurements (0: none)",
    )
    Recorder.add_option(parser)
    args = parser.parse_args()
    variant = "-".join(
        ["load"] * bool(args.load)
        + ([f"slice{args.sampler_slice_us}"] if args.sampler_slice_us is not None else [])
    )
    recorder = Recorder(__file__, __doc__, variant=variant or None)
    # Goals: >= 99.9% of intervals within ±1 ms and < 10% of a core for the NIC;
    # >= 1,000,000 samples/s for the generator.
    work = Path(tempfile.mkdtemp(prefix="sluice-bench-collectors-"))
    try:
        if args.which in ("nic", "all"):
            with Load(args.load):
                collector, peer = bench_nic(
                    work,
                    args.interface,
                    args.seconds,
                    args.realtime_priority,
                    args.sampler_slice_us,
                )
            print(
                f"NIC {args.interface} at 1000 samples/s for {args.seconds:.0f} s, sampling "
                f"thread priority: {args.realtime_priority or 'normal'}, sampler slice: "
                f"{slice_shown(args.sampler_slice_us)}, "
                f"{args.load} CPU-spinning processes beside it "
                f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
            )
            for name, row in (("sluice collect", collector), ("bare python loop", peer)):
                print(
                    f"  {name:17} rate {row['rate_per_s']:8.2f}/s  jitter p50 "
                    f"{row['jitter_p50_ms']:.3f} ms  p99 {row['jitter_p99_ms']:.3f} ms  max "
                    f"{row['jitter_max_ms']:.3f} ms  within ±1 ms {row['within_1ms_pct']:.3f}%  "
                    f"lost {row['lost']}  CPU {row['cpu_pct']:.1f}% of a core"
                )
            print(
                f"  ratios collector/bare: CPU {collector['cpu_pct'] / peer['cpu_pct']:.2f}x, "
                f"p99 jitter {collector['jitter_p99_ms'] / max(peer['jitter_p99_ms'], 1e-9):.2f}x"
            )
        if args.which in ("generator", "all"):
            per_event = 1000
            raw = bench_sqlite(work, args.samples, per_event)
            gen = bench_generator(work, args.samples, per_event)
            print(
                f"Generator, {args.samples:,} samples, {per_event} per event "
                f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
            )
            print(
                f"  sluice collect (buffer + 2PC + store)  {gen['samples_per_s']:12,.0f} "
                f"samples/s  ({gen['seconds']:.2f} s, {gen['cpu_seconds']:.2f} CPU s)"
            )
            print(
                f"  raw SQLite insert (same payloads)      {raw['samples_per_s']:12,.0f} "
                f"samples/s  ({raw['seconds']:.2f} s)"
            )
            print(
                f"  ratio collector/raw SQLite: {gen['samples_per_s'] / raw['samples_per_s']:.2f}"
            )
        if args.write_results:
            nic = (collector, peer) if args.which in ("nic", "all") else None
            generator = (gen, raw) if args.which in ("generator", "all") else None
            notes = [f"{args.load} CPU-spinning processes ran beside both NIC measurements"]
            figures = result_figures(args, nic, generator)
            written = recorder.write(figures, notes if args.load else [])
            print(f"wrote {written}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def slice_shown(slice_us: int | None) -> str:
    if slice_us is None:
        return "the driver's default"
    return "the kernel's default" if slice_us == 0 else f"{slice_us} µs"


def result_figures(args: argparse.Namespace, nic: tuple | None, generator: tuple | None) -> list:
    """The figures of `--write-results`: each (collector, peer) pair of rows measured."""
    figures = []
    if nic is not None:
        what = f"NIC {args.interface} at 1000 samples/s, {args.seconds:.0f} s"
        if args.load:
            what += f", {args.load} CPU-spinning processes beside it"
        if args.sampler_slice_us is not None:
            what += f", sampler slice {slice_shown(args.sampler_slice_us)}"
        bare = "bare loop"
        for label, key, unit, goal in (
            ("CPU", "cpu_pct", "% of a core", "< 10"),
            ("jitter p50", "jitter_p50_ms", "ms", ""),
            ("jitter p99", "jitter_p99_ms", "ms", ""),
            ("jitter max", "jitter_max_ms", "ms", ""),
            ("intervals within ±1 ms", "within_1ms_pct", "%", ">= 99.9"),
            ("samples taken (ticks skipped after a stall lower it)", "rate_per_s", "/s", ""),
        ):
            figures.append(Figure(f"{what}, {label}", unit, nic[0][key], nic[1][key], bare, goal))
    if generator is not None:
        gen, raw = (row["samples_per_s"] for row in generator)
        what = f"generator, {args.samples:,} samples through buffer + 2PC + store"
        figures.append(Figure(what, "samples/s", gen, raw, "raw SQLite insert", ">= 1,000,000"))
    return figures


if __name__ == "__main__":
    main()
