"""Embedded-store behaviour beyond the shared contract: retention, space, many processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import time

from pipeline.streams import Retention, open_store


def test_retention_by_size_keeps_the_newest(store):
    store.create_stream("ret/size", segments=2, retention=Retention(max_bytes=40_000))
    for batch in range(10):
        with store.writer("ret/size") as w:
            for i in range(10):
                w.write(os.urandom(1000), routing_key=f"k{(batch * 10 + i) % 4}")
    before = store.info("ret/size")
    cut = store.apply_retention("ret/size")
    after = store.info("ret/size")
    assert cut is not None and after.head == cut
    assert after.bytes <= 40_000 + 2 * 12_000, "at most one block per segment over the limit"
    assert after.events < before.events
    assert store.apply_retention("ret/size") is None, "already within the limit"


def test_retention_by_age(store):
    store.create_stream("ret/age", retention=Retention(max_age_seconds=60))
    with store.writer("ret/age") as w:
        w.write(b"old")
    boundary = time.time_ns()
    with store.writer("ret/age") as w:
        w.write(b"new")
    store.apply_retention("ret/age", now_ns=boundary + 60 * 10**9)
    assert [e.payload for e in store.read("ret/age")] == [b"new"]


def test_truncation_frees_disk_space(store, store_dir):
    store.create_stream("ret/space")
    with store.writer("ret/space") as w:
        for _ in range(64):
            w.write(os.urandom(64 * 1024))
    path = next((store_dir / "data").rglob("0.seg"))
    used = path.stat().st_blocks
    store.truncate(store.tail("ret/space"))
    assert path.stat().st_blocks < used / 4, "punched hole should free the truncated bytes"
    assert path.stat().st_size > 4 * 1024 * 1024, "offsets never move"


def _append(store_dir: str, key: str, count: int) -> None:
    with open_store(f"embedded:{store_dir}") as store, store.writer("mp/s") as w:
        for i in range(count):
            w.write(f"{key}:{i}".encode(), routing_key=key)
            if i % 5 == 0:
                w.flush()


def _tail_reader(store_dir: str, expected: int, out: mp.Queue) -> None:
    with open_store(f"embedded:{store_dir}") as store:
        reader = store.reader_group("follow", "mp/s").reader("only")
        seen: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(seen) < expected and time.monotonic() < deadline:
            seen += [e.payload for e in reader.read(500, timeout=0.2)]
            reader.commit()
        out.put(seen)


def test_many_processes_write_and_read_at_once(store, store_dir):
    store.create_stream("mp/s", segments=3)
    keys, per = [f"w{i}" for i in range(4)], 300
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    reader = ctx.Process(target=_tail_reader, args=(str(store_dir), len(keys) * per, out))
    reader.start()
    writers = [ctx.Process(target=_append, args=(str(store_dir), k, per)) for k in keys]
    for p in writers:
        p.start()
    for p in writers:
        p.join()
        assert p.exitcode == 0
    seen = out.get(timeout=90)
    reader.join()
    for payloads in (seen, [e.payload for e in store.read("mp/s")]):
        by_key: dict[str, list[int]] = {}
        for p in payloads:
            key, seq = p.decode().split(":")
            by_key.setdefault(key, []).append(int(seq))
        assert by_key == {k: list(range(per)) for k in keys}
