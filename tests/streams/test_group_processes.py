"""Reader groups shared by reader processes: each event is delivered once across the group,
per routing key in order, while segments split and merge and the stream is truncated behind
the group."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

from pipeline.streams import open_store

WORKER = Path(__file__).with_name("group_worker.py")
ROOT = Path(__file__).resolve().parents[2]
KEYS = 12


def start_reader(store_dir, stream, group, reader_id, out_dir, *timeout) -> subprocess.Popen:
    """A reader process, started and joined to the group."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [
        sys.executable,
        str(WORKER),
        str(store_dir),
        stream,
        group,
        reader_id,
        str(out_dir / f"{reader_id}.out"),
        str(out_dir / "stop"),
        *map(str, timeout),
    ]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"joined\n", proc.stderr.read().decode()
    return proc


def delivered(out_dir: Path, *, with_reader: bool = False) -> list[tuple]:
    """(time, key, seq[, reader]) of every event any reader wrote out, in the order they did."""
    rows = []
    for path in out_dir.glob("*.out"):
        for line in path.read_text().splitlines():
            ns, _, _, payload = line.split(" ")
            key, seq = payload.split(":")
            rows.append((int(ns), key, int(seq), *([path.stem] if with_reader else [])))
    return sorted(rows)


def write_while_scaling(store, stream, group, total, rng, *, first=0) -> None:
    """Write `total` keyed events from number `first`; now and then split or merge a segment,
    and truncate the stream at the group's committed position."""
    for start in range(first, first + total, 100):
        with store.writer(stream) as w:
            for i in range(start, start + 100):
                w.write(f"k{i % KEYS}:{i}".encode(), routing_key=f"k{i % KEYS}")
        active = [s for s in store.info(stream).segments if not s.sealed]
        if len(active) < 4 and rng.random() < 0.5:
            store.split_segment(stream, rng.choice(active).segment)
        elif len(active) > 1:
            active.sort(key=lambda s: s.key_range)
            i = rng.randrange(len(active) - 1)
            store.merge_segments(stream, [active[i].segment, active[i + 1].segment])
        store.truncate(group.stream_cut())
        time.sleep(0.02)


def wait_until_read(store, stream, group, procs, deadline_s=60) -> None:
    deadline = time.monotonic() + deadline_s
    while group.stream_cut().segments != store.tail(stream).segments:
        assert time.monotonic() < deadline, f"the group is stuck at {group.stream_cut()}"
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs]
        time.sleep(0.1)


def stop(procs, out_dir) -> None:
    (out_dir / "stop").touch()
    for p in procs:
        assert p.wait(30) == 0, p.stderr.read().decode()


def assert_in_key_order(rows) -> None:
    by_key: dict[str, list[int]] = {}
    for _, key, seq, *_ in rows:
        by_key.setdefault(key, []).append(seq)
    for key, seqs in by_key.items():
        assert seqs == sorted(seqs), f"{key} delivered out of order"


def test_readers_in_three_processes_share_a_scaling_truncated_stream(tmp_path):
    store_dir, out_dir, stream = tmp_path / "streams", tmp_path / "out", "rg/events"
    out_dir.mkdir()
    total = 3000
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream(stream, segments=2)
        group = store.reader_group("workers", stream)
        procs = [start_reader(store_dir, stream, "workers", f"r{i}", out_dir) for i in range(3)]
        write_while_scaling(store, stream, group, total, random.Random(7))
        wait_until_read(store, stream, group, procs)
        stop(procs, out_dir)
    rows = delivered(out_dir)
    assert sorted(seq for _, _, seq in rows) == list(range(total)), "lost or duplicated"
    assert_in_key_order(rows)
    assert len({p.name for p in out_dir.glob("*.out")}) == 3, "every reader got a share"
