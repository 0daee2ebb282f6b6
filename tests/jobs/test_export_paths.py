"""`sluice run export`, then the analytics, with paths users really have: glob characters,
quotes, spaces, `%`, `#`, `~`, non-ASCII letters and a trailing slash in the home, the store
and the output; an output reached through a symbolic link, one whose target moves, and one
directory given two names."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import cli
from tests.jobs.test_export import network, nic, run_export  # noqa: F401

pytestmark = pytest.mark.spark
#: a directory name, and a neighbour the name read as a DuckDB glob would match
NAME, NEIGHBOUR = 'it\'s [1] "x" {a} %20 #2 ~ ünï', 'it\'s 1 "x" {a} %20 #2 ~ ünï'


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / NAME / "streams"


def parquet_count(output: Path) -> int:
    """Rows of the export's published Parquet files (by their footers: any path)."""
    files = output.glob("parquet/date=*/hour=*/*.parquet")
    return sum(pq.read_metadata(f).num_rows for f in files)


def sql(capsys, query: str) -> list[dict]:
    code = cli.main(["sql", "--json", query])
    out, err = capsys.readouterr()
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_an_export_under_any_directory_name_is_read_by_the_views(
    spark,
    network,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """Before, the views read the neighbour's files (`[1]` read as a glob: here a file that
    is no Parquet, so the refresh failed), or with no neighbour the refresh failed: "No files
    found that match the pattern"."""
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / NAME / "home"))
    out = tmp_path / NAME / "out"
    neighbour = tmp_path / NEIGHBOUR / "out" / "parquet" / "date=2020-12-30" / "hour=21"
    neighbour.mkdir(parents=True)  # files the glob `[1]` matched: never read
    shutil.copy(Path(__file__).parent / "test_export.py", neighbour / "part-0.parquet")

    summary = run_export(capsys, network, f"{out}/", "--max-events", "15")  # type: ignore[arg-type]
    assert summary["outputs"]["output"] == str(out)
    assert parquet_count(out) == network.samples

    assert cli.main(["analytics", "refresh"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    rows = "count(*) AS n, count(DISTINCT (_segment, _offset, _sample)) AS d"
    assert sql(capsys, f"SELECT {rows} FROM samples") == [
        {"n": network.samples, "d": network.samples}
    ]
    assert sql(capsys, "SELECT count(*) AS n FROM rates") == [{"n": network.samples}]
    assert sql(capsys, "SELECT count(*) AS n FROM quarantine") == [{"n": 5}]


@pytest.mark.parametrize("second", ["a link to it", "another stream"])
def test_one_output_directory_has_one_checkpoint(
    spark,
    network,  # noqa: F811
    tmp_path,
    capsys,
    second,
):
    """A second checkpoint into a directory that holds files: the same directory under
    another name (a symbolic link), or an export of another stream. Its batches published
    files of the same names: rows counted twice, or the first export's rows replaced. (The
    same export through the link, with its default checkpoint, is the same job: it goes on
    from the first one's checkpoint.)"""
    real = tmp_path / "real"
    first = run_export(capsys, network, real, "--max-events", "15")
    argv = ["--store", f"embedded:{network.store_dir}", "run", "export"]
    argv += ["--schema", "NetworkSamples", "--max-events", "100"]
    if second == "a link to it":
        link = tmp_path / "link"
        link.symlink_to(real)
        again = run_export(capsys, network, link)
        assert (again["checkpoint"], again["events"]) == (first["checkpoint"], 0)
        argv += ["--stream", "edge/network", "--output", str(link)]
        argv += ["--checkpoint", str(tmp_path / "another")]
        target = link
    else:
        network.store.create_stream("edge/other", segments=2)
        with network.store.writer("edge/other") as writer:
            writer.write(nic(1, 50, 1_609_362_000_000_000_000), routing_key="eth1")
        argv += ["--stream", "edge/other", "--output", str(real)]
        target = real

    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    said = (
        f"sluice: error: export to {target}: it holds files an export published with another "
        f"checkpoint (recorded: edge/network to {real}), such as {real}/"
    )
    assert re.search(re.escape(said), err), err
    assert "would publish files of the same names again" in err and "Traceback" not in err
    assert parquet_count(real) == network.samples


def test_a_symlinked_output_whose_target_moves_goes_on_from_its_checkpoint(
    spark,
    network,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    """The link is the output's name: the data moved and the link with it, the export goes on
    from its checkpoint (every sample once), and the views read the new place."""
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")
    first, moved, link = tmp_path / "disk1" / "out", tmp_path / "disk2" / "out", tmp_path / "out"
    first.mkdir(parents=True)
    link.symlink_to(first)
    run_export(capsys, network, link, "--max-events", "15")
    moved.parent.mkdir()
    first.rename(moved)
    link.unlink()
    link.symlink_to(moved)
    with network.store.writer("edge/network") as writer:
        writer.write(nic(41, 50, 1_609_362_000_000_000_000), routing_key="eth1")

    assert run_export(capsys, network, link)["events"] == 1
    assert parquet_count(moved) == network.samples + 50
    assert cli.main(["analytics", "refresh"]) == 0
    capsys.readouterr()
    assert sql(capsys, "SELECT count(*) AS n FROM samples") == [{"n": network.samples + 50}]
