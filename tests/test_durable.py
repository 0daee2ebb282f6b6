"""pipeline.durable: a file is replaced whole or not at all, and no staging file is left."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline import durable


def test_write_json_replaces_the_file_whole(tmp_path):
    path = tmp_path / "sub" / "state.json"
    durable.write_json(path, {"a": 1})
    durable.write_json(path, {"a": 2, "b": [1, 2]}, sort_keys=True)
    assert json.loads(path.read_text()) == {"a": 2, "b": [1, 2]}
    assert path.read_text().endswith("\n")
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_a_failed_write_leaves_the_old_file_and_no_staging(tmp_path):
    path = tmp_path / "results.parquet"
    durable.write_bytes(path, b"old")
    with pytest.raises(RuntimeError, match="writer failed"), durable.atomic_path(path) as staging:
        staging.write_bytes(b"half")
        msg = "writer failed"
        raise RuntimeError(msg)
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["results.parquet"]


def test_staging_is_hidden_and_never_matches_the_final_extension(tmp_path):
    staging = durable.staging_name(tmp_path / "part-1.parquet")
    assert staging.name.startswith(".")
    assert not staging.name.endswith(".parquet")


def test_a_directory_can_be_published(tmp_path):
    target = tmp_path / "state-000001"
    with durable.atomic_path(target) as staging:
        staging.mkdir()
        (staging / "left.arrow").write_bytes(b"1")
    assert sorted(p.name for p in target.iterdir()) == ["left.arrow"]
    assert os.listdir(tmp_path) == ["state-000001"]


def test_writers_replacing_one_file_at_once_never_clash(tmp_path):
    """Two processes creating one store at once both write its `store.json`."""
    import threading

    path = tmp_path / "store.json"
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def write(n: int) -> None:
        start.wait()
        try:
            for _ in range(20):
                durable.write_json(path, {"writer": n})
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert json.loads(path.read_text())["writer"] in range(8)
    assert os.listdir(tmp_path) == ["store.json"]


def test_make_dirs_creates_the_missing_parents_once_and_again(tmp_path, monkeypatch):
    synced = []
    real = durable.fsync_dir
    monkeypatch.setattr(durable, "fsync_dir", lambda path: synced.append(path) or real(path))
    target = tmp_path / "parquet" / "date=2026-11-23" / "hour=19"
    durable.make_dirs(target)
    assert target.is_dir()
    # every new name is made durable in its parent, outermost first
    assert synced == [tmp_path, tmp_path / "parquet", target.parent]
    synced.clear()
    durable.make_dirs(target)  # all there: nothing to create, nothing to sync
    assert synced == []


def test_staging_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that ran and is gone
    dead = durable.staging_name(tmp_path / "part-1.parquet")
    dead = dead.with_name(dead.name.replace(f".{os.getpid()}-", f".{child.pid}-"))
    dead.write_bytes(b"half a file")
    dead_dir = tmp_path / f".state-2.{child.pid}-0badcafe.tmp"
    (dead_dir / "inner").mkdir(parents=True)
    mine = durable.staging_name(tmp_path / "part-2.parquet")  # this process: still writing
    mine.write_bytes(b"being written")
    keep = [tmp_path / "part-0.parquet", tmp_path / ".hidden.tmp", tmp_path / ".x.12-nothex.tmp"]
    for path in keep:
        path.write_bytes(b"not staging")

    assert durable.remove_abandoned(tmp_path) == sorted([dead, dead_dir])
    assert sorted(tmp_path.iterdir()) == sorted([mine, *keep])
    assert durable.remove_abandoned(tmp_path / "missing") == []
