"""The store's format version (FORMAT.md, "Versions"): older stores open, read and are upgraded
to version 3 once, in the catalog and in `store.json`; a store of a newer format is refused by
opening, by the command line and by `repair`, with nothing on disk changed.

The version-2 store is the fixture of test_block_versions.py, written by code from before
version 3 (format 2 in both places, version-1 blocks, an open transaction's flushed body).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pipeline.streams import open_store
from pipeline.streams.embedded.catalog import FORMAT_VERSION
from pipeline.streams.errors import StoreFormatTooNew
from tests.streams.test_block_versions import FIXTURE, STREAM, as_rows, expected
from tests.streams.test_integrity import make_version_1

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def v2_store(tmp_path: Path) -> Path:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "store"


def formats(root: Path) -> tuple[str, object]:
    """The version in the catalog's meta and the one in `store.json`."""
    conn = sqlite3.connect(root / "catalog.db")
    try:
        (version,) = conn.execute("SELECT value FROM meta WHERE key='format_version'").fetchone()
    finally:
        conn.close()
    return version, json.loads((root / "store.json").read_text())["format"]


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under the store: its bytes and modification time."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def sluice(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLUICE_STORE": f"embedded:{root}"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "store", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


def test_a_version_2_store_opens_reads_and_is_upgraded_once(v2_store: Path):
    assert FORMAT_VERSION == 3
    assert formats(v2_store) == ("2", 2)
    with open_store(f"embedded:{v2_store}") as store:
        assert as_rows(store.read(STREAM)) == expected(v2_store)["events"]
    assert formats(v2_store) == ("3", 3)
    upgraded = snapshot(v2_store)
    with open_store(f"embedded:{v2_store}") as store:
        assert as_rows(store.read(STREAM)) == expected(v2_store)["events"]
        assert store.verify().ok
    assert snapshot(v2_store) == upgraded, "a second open changes nothing"


def test_processes_opening_a_version_2_store_at_once_upgrade_it_once(v2_store: Path):
    script = (
        "import sys; from pipeline.streams import open_store\n"
        "with open_store(sys.argv[1]) as store:\n"
        f"    print(sum(1 for _ in store.read({STREAM!r})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, f"embedded:{v2_store}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    events = len(expected(v2_store)["events"])
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert out.strip() == str(events)
    assert formats(v2_store) == ("3", 3)


def test_a_version_1_store_is_upgraded_to_version_3(store_dir: Path):
    with open_store(f"embedded:{store_dir}") as store:
        store.create_stream("v1/s")
    make_version_1(store_dir)
    with open_store(f"embedded:{store_dir}") as store:
        assert store.list_streams() == ["v1/s"]
    assert formats(store_dir) == ("3", 3)


def newer_store(root: Path, where: str) -> Path:
    """A store with events and a torn tail (which an open would cut), then marked format 4 in
    the catalog's meta or in `store.json`; the file that says so."""
    with open_store(f"embedded:{root}") as store:
        store.create_stream("new/s")
        with store.writer("new/s") as writer:
            writer.write(b"written by a newer Sluice", routing_key="k")
    with (root / "data" / "1" / "0.seg").open("ab") as seg:
        seg.write(b"SLB9 a block this code does not know")
    if where == "catalog":
        conn = sqlite3.connect(root / "catalog.db")
        conn.execute("UPDATE meta SET value='4' WHERE key='format_version'")
        conn.commit()
        conn.close()
        return root / "catalog.db"
    raw = json.loads((root / "store.json").read_text())
    (root / "store.json").write_text(json.dumps({**raw, "format": 4}) + "\n")
    return root / "store.json"


def refusal(path: Path) -> str:
    return (
        f"{path} says the store has format 4, newer than this Sluice knows (formats up to 3):"
        " a newer Sluice wrote it. Nothing was changed; upgrade Sluice to open this store"
    )


@pytest.mark.parametrize("where", ["catalog", "store.json"])
def test_a_newer_store_is_refused_and_left_as_it_is(store_dir: Path, where: str):
    path = newer_store(store_dir, where)
    before = snapshot(store_dir)
    with pytest.raises(StoreFormatTooNew, match=re.escape(refusal(path))) as caught:
        open_store(f"embedded:{store_dir}")
    assert (caught.value.path, caught.value.found, caught.value.supported) == (str(path), "4", 3)
    del caught  # the traceback holds the engine that failed to open
    assert snapshot(store_dir) == before
    for args in (("info", "new/s"), ("read", "new/s"), ("repair",), ("verify",)):
        proc = sluice(store_dir, *args)
        assert proc.returncode == 1, args
        assert proc.stdout == ""
        assert proc.stderr == f"sluice: error: {refusal(path)}\n", args
    assert snapshot(store_dir) == before


@pytest.mark.parametrize("catalog", ["unreadable", "missing"])
def test_a_newer_store_without_a_usable_catalog_is_refused_at_open(store_dir: Path, catalog: str):
    """`store.json` is read before the catalog: a newer store's unreadable catalog is not
    taken for damage (nor set aside by `repair`), a missing one is not created."""
    path = newer_store(store_dir, "store.json")
    for wal in store_dir.glob("catalog.db-*"):
        wal.unlink()
    if catalog == "missing":
        (store_dir / "catalog.db").unlink()
    else:
        (store_dir / "catalog.db").write_bytes(b"not a database" * 1000)
    before = snapshot(store_dir)
    with pytest.raises(StoreFormatTooNew, match=re.escape(refusal(path))):
        open_store(f"embedded:{store_dir}")
    proc = sluice(store_dir, "repair")
    assert (proc.returncode, proc.stderr) == (1, f"sluice: error: {refusal(path)}\n")
    assert snapshot(store_dir) == before
