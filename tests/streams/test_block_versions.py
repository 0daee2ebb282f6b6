"""Block format versions: version 2 blocks carry a CRC-32C, version 1 blocks a CRC-32; both
read, verify and detect damage, side by side in one segment. Every store written before
version 2 holds version 1 blocks; since, a process writes the version whose checksum its CPU
computes faster (`faster_version`), so the tests that write run with each (`writing`).

`data/store-blocks-v1.tar.gz` was written by the code of main at af1e9f5 (before version 2):
two segments of writer blocks, one large-event block, a committed transaction, and an open
transaction whose events were flushed (its body's recorded checksum is a CRC-32).
"""

from __future__ import annotations

import json
import re
import tarfile
import time
import zlib
from pathlib import Path

import pytest

from pipeline.streams import open_store
from pipeline.streams.embedded import blocks
from pipeline.streams.embedded.blocks import (
    BLOCK_MAGIC_V1,
    BLOCK_MAGIC_V2,
    BODY_CRC32C,
    HEADER,
    body_checksum,
    body_magic,
    checksum_for,
    encode_header,
    faster_version,
    parse_header,
)
from pipeline.streams.errors import Corrupted

FIXTURE = Path(__file__).parent / "data" / "store-blocks-v1.tar.gz"
STREAM = "old/events"


@pytest.fixture
def v1_store(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "store"


def write_version(monkeypatch: pytest.MonkeyPatch, magic: bytes) -> bytes:
    """Make this process write blocks of version `magic`, as `faster_version` may choose."""
    monkeypatch.setattr(blocks, "BLOCK_MAGIC", magic)
    return magic


@pytest.fixture(params=[BLOCK_MAGIC_V1, BLOCK_MAGIC_V2], ids=["writes-v1", "writes-v2"])
def writing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bytes:
    return write_version(monkeypatch, request.param)


def expected(root: Path) -> dict:
    return json.loads((root / "expected.json").read_text())


def as_rows(events) -> list[list]:
    return [[e.segment, e.offset, e.routing_key, e.payload.decode("latin-1")] for e in events]


def magics(root: Path) -> dict[str, set[bytes]]:
    """The block magics each segment file holds, walking the blocks by their headers."""
    found = {}
    for seg in sorted((root / "data" / "1").glob("*.seg")):
        data, pos, kinds = seg.read_bytes(), 0, set()
        while (header := parse_header(data, pos, pos)) is not None:
            kinds.add(header.magic)
            pos = header.end
        assert pos == len(data)
        found[seg.name] = kinds
    return found


def test_a_version_1_store_reads_and_verifies(v1_store: Path):
    assert set().union(*magics(v1_store).values()) == {BLOCK_MAGIC_V1}
    with open_store(f"embedded:{v1_store}") as store:
        assert as_rows(store.read(STREAM)) == expected(v1_store)["events"]
        report = store.verify(STREAM)
    assert report.ok, report.problems


def test_new_blocks_are_of_the_version_written_here_beside_version_1_ones(
    v1_store: Path, writing: bytes
):
    with open_store(f"embedded:{v1_store}") as store:
        with store.writer(STREAM, writer_id="w1") as writer:
            writer.write(b"after the upgrade", routing_key="k0")
            writer.write(b"y" * 40_000, routing_key="big")
        events = list(store.read(STREAM))
        assert store.verify(STREAM).ok
    assert as_rows(events[:-2]) == expected(v1_store)["events"][: len(events) - 2]
    assert {e.payload for e in events[-2:]} <= {b"after the upgrade", b"y" * 40_000}
    kinds = set().union(*magics(v1_store).values())
    assert kinds == {BLOCK_MAGIC_V1, writing}


def test_a_transaction_flushed_before_the_upgrade_commits_as_a_version_1_block(v1_store: Path):
    txn_id = expected(v1_store)["pending_txn"]
    with open_store(f"embedded:{v1_store}") as store:
        txn = store.get_transaction(STREAM, txn_id)
        txn.write(b"written after the upgrade", routing_key="k1")
        txn.flush()
        txn.write(b"still in memory", routing_key="k1")
        txn.commit()
        payloads = [e.payload for e in store.read(STREAM)]
        assert store.verify(STREAM).ok
    after = [b"written after the upgrade", b"still in memory"]
    assert payloads[-3:] == [b"flushed-before-upgrade", *after]
    assert magics(v1_store)["1.seg"] == {BLOCK_MAGIC_V1}


def test_a_new_transaction_body_records_the_checksum_written_here(tmp_path: Path, writing: bytes):
    with open_store(f"embedded:{tmp_path}") as store:
        store.create_stream("new/events")
        txn = store.begin_transaction("new/events")
        txn.write(b"abc", routing_key="k")
        txn.flush()
        (recorded,) = store._engine.catalog.query_one(
            "SELECT body_crc FROM txn_segments WHERE txn_id=?", (txn.txn_id,)
        )
        assert bool(recorded & BODY_CRC32C) == (writing == BLOCK_MAGIC_V2)
        txn.commit()
        assert [e.payload for e in store.read("new/events")] == [b"abc"]
        assert store.verify("new/events").ok
    (kinds,) = magics(tmp_path).values()
    assert kinds == {writing}


@pytest.mark.parametrize(
    ("began", "ended"),
    [(BLOCK_MAGIC_V2, BLOCK_MAGIC_V1), (BLOCK_MAGIC_V1, BLOCK_MAGIC_V2)],
    ids=["v2-then-v1", "v1-then-v2"],
)
def test_a_transaction_lands_in_the_version_its_body_began_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, began: bytes, ended: bytes
):
    """A transaction flushed by a process writing one version and committed by one writing
    the other (another CPU, or another measurement) keeps its first checksum."""
    write_version(monkeypatch, began)
    with open_store(f"embedded:{tmp_path}") as store:
        store.create_stream("new/events")
        txn = store.begin_transaction("new/events")
        txn.write(b"first", routing_key="k")
        txn.flush()
        txn_id = txn.txn_id
    write_version(monkeypatch, ended)
    with open_store(f"embedded:{tmp_path}") as store:
        txn = store.get_transaction("new/events", txn_id)
        txn.write(b"second", routing_key="k")
        txn.flush()
        txn.write(b"third", routing_key="k")
        txn.commit()
        with store.writer("new/events") as writer:
            writer.write(b"after", routing_key="k")
        assert [e.payload for e in store.read("new/events")] == [
            b"first",
            b"second",
            b"third",
            b"after",
        ]
        assert store.verify("new/events").ok
    (kinds,) = magics(tmp_path).values()
    assert kinds == {began, ended}


def slowed(function, seconds: float):
    def slow(data, value=0):
        time.sleep(seconds)
        return function(data, value)

    return slow


def test_the_writer_picks_the_checksum_this_cpu_computes_faster(monkeypatch: pytest.MonkeyPatch):
    crc32, crc32c = blocks.crc32, blocks.crc32c
    assert faster_version() in {BLOCK_MAGIC_V1, BLOCK_MAGIC_V2}
    monkeypatch.setattr(blocks, "crc32c", slowed(crc32c, 0.002))
    assert faster_version(rounds=2) == BLOCK_MAGIC_V1
    monkeypatch.setattr(blocks, "crc32c", crc32c)
    monkeypatch.setattr(blocks, "crc32", slowed(crc32, 0.002))
    assert faster_version(rounds=2) == BLOCK_MAGIC_V2
    # Neither clearly faster (the same function): version 2, never a toss-up between runs.
    monkeypatch.setattr(blocks, "crc32", crc32c)
    assert faster_version(rounds=20) == BLOCK_MAGIC_V2
    monkeypatch.setattr(blocks, "crc32c", None)  # the crc32c package missing
    assert faster_version() == BLOCK_MAGIC_V1


@pytest.mark.parametrize("kind", ["small", "large"])
def test_damage_in_a_version_1_block_is_found(v1_store: Path, kind: str):
    seg = v1_store / "data" / "1" / ("0.seg" if kind == "small" else "1.seg")
    data = bytearray(seg.read_bytes())
    at = len(data) - 10  # inside the last event's payload
    data[at] ^= 0x40
    seg.write_bytes(bytes(data))
    with open_store(f"embedded:{v1_store}") as store:
        segment = int(seg.stem)
        with pytest.raises(Corrupted, match=re.escape(f"segment {segment}")):
            list(store.read_segment(STREAM, segment, 0))
        assert not store.verify(STREAM).ok


def test_version_1_headers_keep_zlib_crc32():
    body = b"SE" + b"\xff\xff" + (3).to_bytes(4, "little") + b"abc"
    head = encode_header(
        body_crc=zlib.crc32(body), body_len=len(body), events=1, ingest_ns=5, magic=BLOCK_MAGIC_V1
    )
    assert head[:4] == BLOCK_MAGIC_V1
    expected_crc = zlib.crc32(head[8:], zlib.crc32(body))
    assert int.from_bytes(head[4:8], "little") == expected_crc
    header = parse_header(head, 0, 0)
    assert header is not None
    assert header.checksum(body) == zlib.crc32(body)
    assert checksum_for(BLOCK_MAGIC_V2)(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert len(head) == HEADER.size


def test_body_checksum_keeps_the_version_a_body_started_with(monkeypatch: pytest.MonkeyPatch):
    write_version(monkeypatch, BLOCK_MAGIC_V2)
    v1 = zlib.crc32(b"abc")
    assert body_magic(v1, 3) == BLOCK_MAGIC_V1
    assert body_checksum(v1, 3, b"def") == zlib.crc32(b"abcdef")
    v2 = body_checksum(0, 0, b"abc")
    assert body_magic(v2, 3) == BLOCK_MAGIC_V2
    assert body_checksum(v2, 3, b"def") == checksum_for(BLOCK_MAGIC_V2)(b"abcdef") | BODY_CRC32C
