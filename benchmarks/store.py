"""Embedded store vs a plain file, side by side in one run, printed as ratios.

    .venv/bin/python benchmarks/store.py [--events 2000] [--batch 16]

1. Durable append of 64 KiB events (about one NIC event of 1000 samples), 1 and 4 writer
   processes (each its own routing key, a 4-segment stream), through the public writer API:
   `write()` each event, `flush()` after every batch (one block, one fdatasync); the peer is
   the same processes writing the same bytes to plain files, one `writev` + `fdatasync` per
   batch, each file created durably (its directory fsynced, as the store does for a new
   segment file). Timed from when every process has opened its store (or is about to create
   its file) until the last one's final flush returned, so process start-up and opening the
   store, one-off costs, are not counted on either side; the median of several rounds, the
   two sides taken in turns, the order alternating (a shared disk slows both alike).
2. Transaction commit latency p50/p99 (one 64 KiB event per transaction, begin-write-commit),
   beside one pwrite+fdatasync of the same bytes, taken in turns; and the syncs one such
   transaction costs: the store's own `os.fsync`/`os.fdatasync` calls plus the catalog commits
   made with synchronous=FULL (one WAL sync each), beside the peer's one `fdatasync`.
3. Bounded read between two cuts (page cache), every block's checksum and frames checked
   before its events are returned, vs reading the same bytes from a plain file (no checks):
   - `store.read(stream, head, tail)`, the per-event API (an `Event` with its own payload
     bytes per event);
   - `store.read_batches(stream, head, tail)`, the batch API the Spark range tasks use (an
     `EventBatch` per run of blocks, payloads as slices of its buffer: no copy per event);
   - the floor of a checked read that returns each event as its own bytes: the plain file
     read in 1 MiB pieces, the block checksum over each, each event copied out, no per-event
     Python (the per-event API's ratio to the floor is what its Python costs);
   - what a Spark range task does with the batches: `read_range`, each segment's range into
     Arrow batches of the `sluice` source's columns (each task opens the store; no Spark);
   and `verify` (every stored block checked, nothing returned) over the same store. Best of
   several rounds taken in turns, also in CPU time (steadier on a machine shared with others).

Blocks are checksummed with CRC-32C (the `crc32c` package: SSE4.2 / ARMv8 CRC instructions) or
CRC-32 (zlib-ng: VPCLMULQDQ on AVX-512 CPUs), whichever this machine computes faster
(FORMAT.md, "Block versions"). The first line of output says which function computes the
checksum of the blocks written here.
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.durable import fsync_dir
from pipeline.spark.reading import SegmentRange, read_range
from pipeline.streams import open_store
from pipeline.streams.embedded.blocks import BLOCK_MAGIC, checksum_for

EVENT = 64 * 1024
STREAM = "bench/appends"
#: The checksum of the blocks this process writes (the floor computes the same).
checksum = checksum_for(BLOCK_MAGIC)


class Race:
    """What the processes of one timed run share: a start barrier (every process ready) and
    when each one started and finished (time.perf_counter: one clock for all processes)."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._start = mp.Barrier(processes)
        self._times = mp.Queue()
        self._started = 0.0

    def go(self) -> None:
        self._start.wait(timeout=300)
        self._started = time.perf_counter()

    def done(self) -> None:
        self._times.put((self._started, time.perf_counter()))

    def seconds(self) -> float:
        """From the first process's start to the last one's end."""
        times = [self._times.get(timeout=60) for _ in range(self.processes)]
        return max(end for _, end in times) - min(start for start, _ in times)


def sluice_writer(store_dir: str, key: str, events: int, batch: int, race: Race) -> None:
    payload = os.urandom(EVENT)
    with open_store(f"embedded:{store_dir}") as store:
        writer = store.writer(STREAM)
        race.go()
        for i in range(events):
            writer.write(payload, routing_key=key)
            if (i + 1) % batch == 0:
                writer.flush()
        writer.flush()
        race.done()


def file_writer(path: str, events: int, batch: int, race: Race) -> None:
    payload = os.urandom(EVENT)
    race.go()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    fsync_dir(Path(path).parent)  # the new file's entry is durable, as a new segment file's is
    try:
        pending = []
        for i in range(events):
            pending.append(payload)
            if (i + 1) % batch == 0:
                os.writev(fd, pending)
                os.fdatasync(fd)
                pending = []
        if pending:
            os.writev(fd, pending)
            os.fdatasync(fd)
    finally:
        os.close(fd)
    race.done()


def run_procs(target, arglists) -> float:
    """Seconds from when every process was ready (all waited at a barrier, then started at
    once) until the last one's writes returned."""
    race = Race(len(arglists))
    procs = [mp.Process(target=target, args=(*a, race)) for a in arglists]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            msg = f"benchmark process failed with exit code {p.exitcode}"
            raise RuntimeError(msg)
    return race.seconds()


def keys_for_segments(segments: int) -> list[str]:
    """One routing key per segment of an evenly split stream."""
    from pipeline.streams.embedded.store import key_position

    by_segment: dict[int, str] = {}
    for k in (f"sensor-{i}" for i in range(1000)):
        by_segment.setdefault(int(key_position(k) * segments), k)
    return [by_segment[i] for i in range(segments)]


def sluice_appends(store_dir: Path, writers: int, segments: int, per: int, batch: int) -> float:
    shutil.rmtree(store_dir, ignore_errors=True)
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(STREAM, segments=segments)
    keys = keys_for_segments(4)  # 4 distinct keys: on 4 segments, or all on 1
    args = [(str(store_dir), keys[i % 4], per, batch) for i in range(writers)]
    return run_procs(sluice_writer, args)


def file_appends(workdir: Path, writers: int, per: int, batch: int) -> float:
    paths = [workdir / f"plain-{writers}-{i}" for i in range(writers)]
    for path in paths:
        path.unlink(missing_ok=True)
    return run_procs(file_writer, [(str(path), per, batch) for path in paths])


def bench_appends(
    workdir: Path, writers: int, events: int, batch: int, rounds: int
) -> tuple[float, float]:
    """MB/s of the store and of plain files, each the median of `rounds` taken in turns (the
    order alternating): a disk shared with other work slows both alike, and one lucky or
    unlucky round moves neither figure much."""
    per = events // writers
    mb = per * writers * EVENT / 1e6
    rates: dict[str, list[float]] = {"sluice": [], "plain": []}
    contenders = {
        "sluice": lambda: sluice_appends(workdir / f"store-{writers}", writers, 4, per, batch),
        "plain": lambda: file_appends(workdir, writers, per, batch),
    }
    for r in range(rounds):
        for name in ("sluice", "plain") if r % 2 == 0 else ("plain", "sluice"):
            rates[name].append(mb / contenders[name]())
    return statistics.median(rates["sluice"]), statistics.median(rates["plain"])


def bench_commits(workdir: Path, count: int) -> tuple[list[float], list[float]]:
    """Latencies of begin-write-commit and of pwrite+fdatasync, taken in turns (one of each,
    over and over), so that a machine shared with other work slows both alike."""
    payload = os.urandom(EVENT)
    fd = os.open(workdir / "plain-latency", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    lat, plain = [], []
    try:
        with open_store(f"embedded:{workdir / 'txn'}") as store:
            store.create_stream("bench/txn", segments=1)
            for _ in range(count):
                t0 = time.perf_counter()
                txn = store.begin_transaction("bench/txn")
                txn.write(payload, routing_key="k")
                txn.commit()
                lat.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                os.write(fd, payload)
                os.fdatasync(fd)
                plain.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
    return lat, plain


def count_commit_syncs(workdir: Path, count: int) -> float:
    """Syncs per begin-write-commit of one 64 KiB event: `os.fsync`/`os.fdatasync` calls plus
    COMMITs on the catalog's synchronous=FULL connection (each syncs the write-ahead log)."""
    payload = os.urandom(EVENT)
    calls = {"syncs": 0}
    real = {name: getattr(os, name) for name in ("fsync", "fdatasync")}

    def counting(name: str):
        def sync(fd: int) -> None:
            calls["syncs"] += 1
            real[name](fd)

        return sync

    def on_statement(sql: str) -> None:
        if sql.strip().upper() == "COMMIT":
            calls["syncs"] += 1

    with open_store(f"embedded:{workdir / 'txn-syncs'}") as store:
        store.create_stream("bench/syncs", segments=1)

        def transaction() -> None:
            txn = store.begin_transaction("bench/syncs")
            txn.write(payload, routing_key="k")
            txn.commit()

        transaction()  # the segment file and its directories are created once, not counted
        store._engine.catalog.meta.set_trace_callback(on_statement)
        try:
            for name in real:
                setattr(os, name, counting(name))
            for _ in range(count):
                transaction()
        finally:
            for name, function in real.items():
                setattr(os, name, function)
    return calls["syncs"] / count


def plain_read(paths: list[Path]) -> int:
    """The peer of a bounded read: the files read in 64 KiB `read`s (one event each); bytes."""
    total = 0
    for path in paths:
        with path.open("rb") as fh:
            while chunk := fh.read(EVENT):
                total += len(chunk)
    return total


def bench_read(workdir: Path, rounds: int) -> tuple[dict[str, float], dict[str, float], int]:
    """Best wall and CPU seconds of the store's and the plain files' reads, taken in turns (a
    machine shared with other work slows both alike); the page cache is warm."""
    store_dir = workdir / "store-4"
    plain = sorted(workdir.glob("plain-4-*"))
    wall: dict[str, float] = {}
    cpu: dict[str, float] = {}
    uri = f"embedded:{store_dir}"
    with open_store(uri) as store:
        head, tail = store.head(STREAM), store.tail(STREAM)

        def sluice() -> int:
            return sum(len(e.payload) for e in store.read(STREAM, head, tail))

        def batches() -> int:
            return sum(batch.nbytes for batch in store.read_batches(STREAM, head, tail))

        parts = [SegmentRange(uri, STREAM, seg, a, b) for seg, a, b in head.spans_until(tail)]

        def spark_range() -> int:
            """What the Spark range tasks do: each segment's range read into Arrow batches of
            the source's columns (`read_range`, the store opened by each task)."""
            return sum(
                pc.sum(pc.binary_length(rb.column("payload"))).as_py()
                for part in parts
                for rb in read_range(part)
            )

        def plain_file() -> int:
            return plain_read(plain)

        def floor() -> int:
            """The least a checked read returning each event as bytes does, without any
            per-event Python: 1 MiB reads into a reused page-aligned buffer (as the store
            reads its blocks), the block checksum over each, each 64 KiB event copied out into
            its own bytes."""
            total, buffer = 0, mmap.mmap(-1, 16 * EVENT)
            view = memoryview(buffer)
            for path in plain:
                with path.open("rb", buffering=0) as fh:
                    while got := fh.readinto(buffer):
                        checksum(view[:got])
                        for at in range(0, got, EVENT):
                            total += len(bytes(view[at : at + EVENT]))
            return total

        contenders = (
            ("sluice", sluice),
            ("plain", plain_file),
            ("batches", batches),
            ("floor", floor),
            ("spark", spark_range),
        )
        for _ in range(rounds + 1):  # the first round warms the page cache
            for name, read in contenders:
                t0, c0 = time.perf_counter(), time.process_time()
                nbytes = read()
                wall[name] = min(wall.get(name, float("inf")), time.perf_counter() - t0)
                cpu[name] = min(cpu.get(name, float("inf")), time.process_time() - c0)
    return wall, cpu, nbytes


def bench_verify(workdir: Path) -> float:
    """MB/s of `verify` over the 4-writer store (page cache)."""
    with open_store(f"embedded:{workdir / 'store-4'}") as store:
        store.verify(STREAM)  # warm
        t0 = time.perf_counter()
        report = store.verify(STREAM)
        elapsed = time.perf_counter() - t0
    assert report.ok, report.problems
    return report.bytes / 1e6 / elapsed


def read_figures(wall: dict[str, float], cpu: dict[str, float], nbytes: int) -> list[Figure]:
    """The read rows: each API against the plain file, the per-event API against the floor;
    in wall time, then per CPU second."""
    read = f"verified bounded read between cuts ({nbytes / 1e6:.0f} MB, page cache)"
    peer = "plain file (unchecked)"
    floor = "plain file + checksum + a copy per event (no per-event Python)"
    rows = (
        ("store.read (an Event per event)", "sluice", "plain", peer, ">= 0.80"),
        ("store.read (an Event per event)", "sluice", "floor", floor, ""),
        ("store.read_batches (Spark's)", "batches", "plain", peer, ">= 0.80"),
        ("the Spark range task (read_range: Arrow batches)", "spark", "plain", peer, ""),
    )
    figures = []
    for seconds, unit in ((wall, ""), (cpu, ", per CPU second")):
        rate = {name: nbytes / 1e6 / s for name, s in seconds.items()}
        for api, ours, theirs, peer_name, goal in rows:
            what = f"{read}, {api}{unit}"
            shown = "" if unit else goal
            figures.append(Figure(what, "MB/s", rate[ours], rate[theirs], peer_name, shown))
    return figures


def checksum_implementation() -> str:
    return f"{checksum.__module__}.{checksum.__name__}"


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000, help="64 KiB events per run")
    parser.add_argument("--batch", type=int, default=16, help="events per flush / fsync")
    parser.add_argument("--rounds", type=int, default=5, help="append rounds (median)")
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--reads", type=int, default=5, help="read rounds, best one counts")
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as tmp:
        figures = measure(Path(tmp), args)
    for f in figures:
        peer = f"   {f.peer_name} {f.peer:8.2f} {f.unit}   ratio {f.ratio:5.2f}" if f.peer else ""
        goal = f"  (goal {f.goal})" if f.goal else ""
        print(f"{f.what}: sluice {f.sluice:8.2f} {f.unit}{peer}{goal}")
    if args.write_results:
        notes = [f"block checksums: written with {checksum_implementation()}"]
        print(f"wrote {recorder.write(figures, notes)}")


def measure(workdir: Path, args: argparse.Namespace) -> list[Figure]:
    """Every figure of the module docstring, in its order."""
    print(f"block checksums: written with {checksum_implementation()}", flush=True)
    figures = []
    for writers in (1, 4):
        ours, peer = bench_appends(workdir, writers, args.events, args.batch, args.rounds)
        what = (
            f"durable append of 64 KiB events, {writers} writer(s), write() each,"
            f" flush() (fsync) every {args.batch}"
        )
        figures.append(Figure(what, "MB/s", ours, peer, "plain file", ">= 0.80"))
    per = args.events // 4
    one = sluice_appends(workdir / "seg-1", 4, 1, per, args.batch)
    four = sluice_appends(workdir / "seg-4", 4, 4, per, args.batch)
    mb = per * 4 * EVENT / 1e6
    what = "4 writers into 4 segments (peer: the same into 1 segment)"
    figures.append(Figure(what, "MB/s", mb / four, mb / one, "sluice, 1 segment"))
    lat, plain = bench_commits(workdir, args.commits)
    for q, goal in ((50, "<= 2"), (99, "")):
        what = f"transaction commit p{q} (begin, write 64 KiB, commit)"
        figures.append(Figure(what, "ms", pct(lat, q), pct(plain, q), "pwrite + fdatasync", goal))
    what = "syncs per transaction (begin, write 64 KiB, commit)"
    syncs = count_commit_syncs(workdir, 50)
    figures.append(Figure(what, "syncs", syncs, 1.0, "pwrite + fdatasync"))
    wall, cpu, nbytes = bench_read(workdir, args.reads)
    figures += read_figures(wall, cpu, nbytes)
    what = "verify (every block checked, nothing returned)"
    figures.append(Figure(what, "MB/s", bench_verify(workdir)))
    return figures


if __name__ == "__main__":
    main()
