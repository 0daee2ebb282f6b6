"""`sluice store verify` and `sluice store repair` as an operator runs them: real processes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.collectors.conftest import run_cli


@pytest.fixture
def store_dir(tmp_path) -> Path:
    return tmp_path / "s"


@pytest.fixture
def sluice(store_dir):
    env = {"SLUICE_STORE": f"embedded:{store_dir}"}

    def run(*args: str, stdin: str = "", rc: int = 0) -> subprocess.CompletedProcess:
        proc = run_cli(*args, env=env, stdin=stdin, timeout=60)
        assert proc.returncode == rc, proc.stderr
        assert "Traceback" not in proc.stderr
        return proc

    return run


def events(prefix: str, count: int) -> str:
    return "".join(f'{{"{prefix}": {i}}}\n' for i in range(count))


def test_an_intact_store_verifies_and_a_flipped_byte_is_found_refused_and_contained(
    sluice, store_dir
):
    sluice("store", "create", "site/net", "--segments", "2")
    sluice("store", "write", "site/net", "-k", "k1", stdin=events("a", 50))
    sluice("store", "write", "site/net", "-k", "zz", stdin=events("b", 50))
    assert sluice("store", "verify").stdout.startswith("intact: 1 stream, 2 segments")
    before = sluice("store", "read", "site/net").stdout.splitlines()
    assert len(before) == 100

    damaged = store_dir / "data" / "1" / "0.seg"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))

    found = sluice("store", "verify", "site/net", rc=1)
    assert found.stdout.startswith("site/net segment 0 offset 0: checksum mismatch")
    assert "sluice store repair" in found.stderr
    refused = sluice("store", "read", "site/net", rc=1)
    assert refused.stderr.startswith("sluice: error: stream site/net segment 0 is damaged")
    assert not set(refused.stdout.splitlines()) - set(before)  # nothing altered is served

    repaired = sluice("store", "repair", rc=1)  # the block's events cannot come back
    assert "fixed: site/net segment 0: sealed it" in repaired.stdout
    assert "not fixed: site/net segment 0 offset 0: a damaged block of 50 events" in (
        repaired.stdout
    )
    sluice("store", "write", "site/net", "-k", "k1", stdin=events("c", 3))  # a new segment
    still = sluice("store", "verify", rc=1).stdout.splitlines()
    assert [line.split(":")[0] for line in still] == ["site/net segment 0 offset 0"]


def test_a_truncated_segment_refuses_writes_until_repair(sluice, store_dir):
    sluice("store", "create", "site/net")
    for _ in range(3):
        sluice("store", "write", "site/net", "-k", "k", stdin=events("a", 10))
    segment = store_dir / "data" / "1" / "0.seg"
    with segment.open("r+b") as fh:
        fh.truncate(segment.stat().st_size - 5)
    assert "segment 0" in sluice("store", "verify", rc=1).stdout
    refused = sluice("store", "write", "site/net", "-k", "k", stdin=events("b", 1), rc=1)
    assert "repair" in refused.stderr
    lost = sluice("store", "repair", rc=1).stdout  # the cut-off block's events are gone
    assert "not fixed: site/net segment 0" in lost
    assert "10 events in 1 block from" in lost
    sluice("store", "verify")
    sluice("store", "write", "site/net", "-k", "k", stdin=events("b", 1))
    assert len(sluice("store", "read", "site/net").stdout.splitlines()) == 21
