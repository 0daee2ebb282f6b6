"""Damage the embedded store's files at random: a damaged byte is never served and `verify`
names where it is; a truncated segment refuses writes until `repair` and loses no valid event
before the damage; a lost or corrupted catalog is rebuilt; a full disk is a typed error that
leaves acknowledged data intact (issue 11)."""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.streams import StreamCut, StreamStoreError, open_store
from pipeline.streams.embedded.routing import key_position
from pipeline.streams.errors import Corrupted, SegmentDamaged
from tests.disks import small_disk

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("SLUICE_DAMAGE_SEED", "0")) or random.randrange(1 << 30)
FLIPS = 300
TRUNCATIONS = 50


@dataclass(frozen=True)
class Block:
    stream: str
    segment: int
    offset: int
    end: int
    path: Path


def key_in(store, stream: str, segment: int) -> str:
    """A routing key that lands in `segment` (by its key range)."""
    lo, hi = store.info(stream).segment(segment).key_range
    return next(k for k in (f"key-{i}" for i in range(100_000)) if lo <= key_position(k) < hi)


def build(root: Path) -> None:
    """Several streams and segments: small and large events, an idempotent writer, a scale,
    transactions with time bounds, and a truncated head."""
    rng = random.Random(7)
    with open_store(f"embedded:{root}") as store:
        store.create_stream("dmg/one")
        with store.writer("dmg/one") as w:
            for b in range(12):
                for i in range(rng.choice([1, 3, 8])):
                    size = 30_000 if b % 4 == 0 else rng.randrange(10, 400)
                    w.write(rng.randbytes(size), routing_key=f"k{i % 3}")
                w.flush()
        store.create_stream("dmg/three", segments=3)
        with store.writer("dmg/three", writer_id="edge-1") as w:
            for n in range(1, 121):
                w.write(f"three:{n}".encode() * 5, routing_key=f"s{n % 7}", event_number=n)
                if n % 6 == 0:
                    w.flush()
        head = store.tail("dmg/three")
        store.split_segment("dmg/three", 1)
        with store.writer("dmg/three", writer_id="edge-1") as w:
            for n in range(121, 181):
                w.write(f"three:{n}".encode() * 5, routing_key=f"s{n % 7}", event_number=n)
                if n % 6 == 0:
                    w.flush()
        events = list(store.read("dmg/three"))
        store.truncate(
            StreamCut.of("dmg", "three", {**head.segments, 0: events[3].offset, 3: 0, 4: 0})
        )
        store.create_stream("dmg/txn", segments=2)
        for t in range(8):
            txn = store.begin_transaction("dmg/txn")
            for i in range(rng.randrange(1, 9)):
                txn.write(f"txn:{t}:{i}".encode() * 9, routing_key=f"t{i}")
            txn.commit(time_bounds=(t * 100, t * 100 + 99))


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("damage") / "template"
    build(root)
    return root


def snapshot(root: Path) -> dict[str, list[tuple]]:
    """Every event of every stream: (segment, offset, end, key, payload)."""
    with open_store(f"embedded:{root}") as store:
        return {
            s: [
                (e.segment, e.offset, e.end_offset, e.routing_key, e.payload) for e in store.read(s)
            ]
            for s in store.list_streams()
        }


def blocks_of(root: Path) -> list[Block]:
    """Every indexed block from each segment's head block on."""
    names = {}
    for manifest in (root / "data").glob("*/stream.json"):
        found = json.loads(manifest.read_text())
        heads = {s["segment"]: s["head_block"] for s in found["segments"]}
        names[found["stream_id"]] = (f"{found['scope']}/{found['name']}", heads)
    conn = sqlite3.connect(f"file:{root / 'catalog.db'}?mode=ro", uri=True)
    rows = conn.execute("SELECT stream_id, segment, offset, length FROM blocks").fetchall()
    conn.close()
    blocks = []
    for stream_id, segment, offset, length in rows:
        name, heads = names[stream_id]
        if offset >= heads[segment]:
            path = root / "data" / str(stream_id) / f"{segment}.seg"
            blocks.append(Block(name, segment, offset, offset + length, path))
    return sorted(blocks, key=lambda b: (b.stream, b.segment, b.offset))


def read_segment_until_damage(
    store, stream: str, segment: int
) -> tuple[list[tuple], Exception | None]:
    got, error = [], None
    head = store.head(stream).segments[segment]
    try:
        for e in store.read_segment(stream, segment, head):
            got.append((e.segment, e.offset, e.end_offset, e.routing_key, e.payload))
    except StreamStoreError as exc:
        error = exc
    return got, error


def test_random_byte_flips_are_never_served_and_always_found(template, tmp_path):
    rng = random.Random(SEED)
    expected = snapshot(template)
    blocks = blocks_of(template)
    assert len({(b.stream, b.segment) for b in blocks}) >= 6
    for flip in range(FLIPS):
        root = tmp_path / f"flip-{flip}"
        shutil.copytree(template, root)
        block = rng.choice(blocks)
        offset = rng.randrange(block.offset, block.end)
        path = root / block.path.relative_to(template)
        with path.open("r+b") as fh:
            fh.seek(offset)
            byte = fh.read(1)[0]
            fh.seek(offset)
            fh.write(bytes([byte ^ rng.randrange(1, 256)]))
        context = f"seed {SEED}, flip {flip}: {block} byte {offset}"
        with open_store(f"embedded:{root}") as store:
            got, error = read_segment_until_damage(store, block.stream, block.segment)
            assert isinstance(error, Corrupted), f"{context}: {error!r}"
            assert (error.stream, error.segment) == (block.stream, block.segment), context
            assert block.offset <= error.offset <= block.end, context
            before = [e for e in expected[block.stream] if e[0] == block.segment]
            assert got == [e for e in before if e[2] <= block.offset], context
            report = store.verify()
            assert (block.stream, block.segment) in {
                (p.stream, p.segment) for p in report.problems
            }, context
        shutil.rmtree(root)


def test_random_truncations_refuse_writes_until_repair(template, tmp_path):
    rng = random.Random(SEED + 1)
    expected = snapshot(template)
    blocks = blocks_of(template)
    files = sorted({(b.stream, b.segment, b.path) for b in blocks}, key=str)
    for cut in range(TRUNCATIONS):
        root = tmp_path / f"cut-{cut}"
        shutil.copytree(template, root)
        stream, segment, template_path = rng.choice(files)
        path = root / template_path.relative_to(template)
        at = rng.randrange(0, path.stat().st_size)
        os.truncate(path, at)
        context = f"seed {SEED}, truncation {cut}: {stream} segment {segment} at {at}"
        ends = {b.offset: b.end for b in blocks if (b.stream, b.segment) == (stream, segment)}
        whole = [e for e in expected[stream] if e[0] == segment and block_end(ends, e[1]) <= at]
        with open_store(f"embedded:{root}") as store:
            got, error = read_segment_until_damage(store, stream, segment)
            assert got == whole, context
            assert isinstance(error, Corrupted | None), f"{context}: {error!r}"
            key = key_in(store, stream, segment)
            if not store.info(stream).segment(segment).sealed:
                with pytest.raises(SegmentDamaged, match="sluice store repair"):
                    with store.writer(stream) as w:
                        w.write(b"refused", routing_key=key)
            assert (stream, segment) in {(p.stream, p.segment) for p in store.verify().problems}
            store.repair()
            with store.writer(stream) as w:
                w.write(b"after repair", routing_key=key)
            got, error = read_segment_until_damage(store, stream, segment)
            assert error is None and got == whole, context
            assert store.verify().ok, f"{context}: {store.verify().problems}"
        shutil.rmtree(root)


def block_end(ends: dict[int, int], offset: int) -> int:
    """The end of the block that holds the event at `offset`."""
    return ends[max(o for o in ends if o <= offset)]


@pytest.mark.parametrize("loss", ["lost", "corrupted"])
def test_a_lost_or_corrupted_catalog_is_rebuilt_by_repair(template, tmp_path, loss):
    root = tmp_path / "store"
    shutil.copytree(template, root)
    expected = snapshot(template)
    for path in root.glob("catalog.db*"):
        path.unlink()
    if loss == "corrupted":
        (root / "catalog.db").write_bytes(random.Random(SEED).randbytes(64 * 1024))
    with open_store(f"embedded:{root}") as store:
        with pytest.raises(StreamStoreError, match="sluice store repair"):
            store.list_streams()
        report = store.repair()
        assert report.ok, report.unfixed
    assert snapshot(root) == expected
    with open_store(f"embedded:{root}") as store:
        assert store.verify().ok
        with store.writer("dmg/three", writer_id="edge-1") as w:
            w.write(b"resent", routing_key="s5", event_number=180)  # already stored: dropped
            w.write(b"new", routing_key="s5", event_number=181)
        after = [e.payload for e in store.read("dmg/three")]
        assert after.count(b"new") == 1
        assert after.count(b"resent") == 0, "writer positions were rebuilt from the blocks"


# --- a full disk ---------------------------------------------------------------------------
FULL_DISK = textwrap.dedent(
    """
    import json, os, resource, signal, sys
    from pipeline.streams import open_store
    from pipeline.streams.errors import StoreFull

    store_dir, limit = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # over the limit: EFBIG, not a signal
    store = open_store(f"embedded:{store_dir}")
    store.create_stream("full/s")
    writer = store.writer("full/s", writer_id="w")
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    acked, failed = 0, None
    for n in range(1, 10_000):
        writer.write(os.urandom(48_000), routing_key="k", event_number=n)
        try:
            writer.flush()
            acked = n
        except StoreFull as exc:
            failed = str(exc)
            break
    print(json.dumps({"acked": acked, "failed": failed}))
    """
)


def test_a_full_disk_is_a_typed_error_and_recovers(tmp_path):
    with small_disk(tmp_path / "small-disk", "6m") as disk:
        store_dir = tmp_path / "small-disk" / "streams"
        if disk is not None:
            disk.take(1 << 20)
        elif not _has_resource():
            pytest.skip("neither a tmpfs mount (needs root) nor RLIMIT_FSIZE is available")
        limit = 0 if disk else 3 << 20  # else the subprocess's own file size limit
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", FULL_DISK, str(store_dir), str(limit)],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert result["failed"] and "no space left" in result["failed"], result
        acked = result["acked"]
        assert acked > 0
        if disk:
            disk.free()  # space freed: the same store takes writes again
        with open_store(f"embedded:{store_dir}") as store:
            numbers = [e.payload for e in store.read("full/s")]
            assert len(numbers) in (acked, acked + 1), "acknowledged data intact, no torn event"
            assert store.verify().ok, store.verify().problems
            writer = store.writer("full/s", writer_id="w")
            for n in range(acked + 1, acked + 5):
                writer.write(b"after", routing_key="k", event_number=n)
            writer.flush()
            assert len(list(store.read("full/s"))) == acked + 4, "resends after the failure dedup"


def _has_resource() -> bool:
    try:
        import resource  # noqa: F401
    except ImportError:
        return False
    return True
