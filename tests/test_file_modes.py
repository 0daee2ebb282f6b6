"""Files Sluice writes are owner-only (0600, directories 0700) unless SLUICE_GROUP_READ=1
(0640/0750), issue 13: the `sluice` command sets the umask, so whatever part of Sluice writes
(the stream store, `sluice join`, the collector) follows."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from tests.collectors.conftest import run_cli

REPO = Path(__file__).resolve().parents[1]
MODES = {"": (0o600, 0o700), "1": (0o640, 0o750)}


def sluice(*args: str, group_read: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"SLUICE_GROUP_READ": group_read, "PYTHONPATH": str(REPO)}
    return run_cli(*args, env=env, cwd=cwd)


def modes_under(root: Path) -> set[tuple[str, int]]:
    found = {("dir", stat.S_IMODE(root.stat().st_mode))}
    for path in root.rglob("*"):
        kind = "dir" if path.is_dir() else "file"
        found.add((kind, stat.S_IMODE(path.stat().st_mode)))
    return found


@pytest.mark.parametrize("group_read", MODES)
def test_the_stream_store_written_by_the_command_follows_the_setting(tmp_path, group_read):
    file_mode, dir_mode = MODES[group_read]
    streams = tmp_path / "streams"
    sluice(
        "--store",
        f"embedded:{streams}",
        "store",
        "create",
        "a/b",
        group_read=group_read,
        cwd=tmp_path,
    )
    assert modes_under(streams) == {("dir", dir_mode), ("file", file_mode)}


@pytest.mark.parametrize("group_read", MODES)
def test_a_join_output_follows_the_setting(tmp_path, group_read):
    (tmp_path / "l.csv").write_text("time,a\n1,2\n")
    (tmp_path / "r.csv").write_text("time,b\n1,3\n")
    joined = sluice(
        "join", "l.csv", "r.csv", "-o", "out/pairs.parquet", group_read=group_read, cwd=tmp_path
    )
    assert joined.returncode == 0, joined.stderr
    file_mode, dir_mode = MODES[group_read]
    assert stat.S_IMODE((tmp_path / "out" / "pairs.parquet").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == dir_mode


def test_an_unreadable_setting_is_an_error_naming_it(tmp_path):
    result = sluice("store", "list", group_read="maybe", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == (
        "sluice: error: environment variable SLUICE_GROUP_READ: 'maybe' is not true or false; "
        "use 1 or 0\n"
    )


def test_the_stream_store_used_as_a_library_makes_its_data_owner_only(tmp_path, monkeypatch):
    """Without the command's umask (a notebook, a Dagster code location) the store still
    creates its segment files, transaction bodies and stream directories owner-only."""
    from pipeline.streams import open_store

    monkeypatch.delenv("SLUICE_GROUP_READ", raising=False)
    previous = os.umask(0o022)
    try:
        with open_store(f"embedded:{tmp_path / 's'}") as store:
            store.create_stream("a/b", segments=2)
            with store.writer("a/b") as writer:
                writer.write(b"x", routing_key="k")
            txn = store.begin_transaction("a/b")
            txn.write(b"y", routing_key="k")
            txn.flush()
    finally:
        os.umask(previous)
    data = tmp_path / "s" / "data"
    created = [p for p in data.rglob("*") if p.suffix in (".seg", ".body") or p.is_dir()]
    assert any(p.suffix == ".seg" for p in created)
    for path in created:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


@pytest.mark.spark
def test_sparks_checkpoint_files_follow_the_setting(spark, store, store_dir, tmp_path, capsys):
    # Hadoop applies its own umask (022) to the files it writes: offsets, commits, metadata
    from pipeline import cli

    store.create_stream("edge/n")
    event = b'{"TimestampNanos": [1], "RxBytes": [1], "TxBytes": [2], "RemoteAddr": "a", '
    with store.writer("edge/n") as writer:
        writer.write(event + b'"Interface": "eth0"}', routing_key="k")
    checkpoint = tmp_path / "checkpoint"
    export = ["run", "export", "--stream", "edge/n", "--schema", "NetworkSamples"]
    where = ["--output", str(tmp_path / "out"), "--checkpoint", str(checkpoint)]
    spark_only = ["--in-process-bytes", "0"]
    code = cli.main(["--store", f"embedded:{store_dir}", *export, *where, *spark_only])
    assert code == 0, capsys.readouterr().err
    assert (checkpoint / "spark" / "offsets" / "0").exists()
    assert modes_under(checkpoint / "spark") == {("dir", 0o700), ("file", 0o600)}
