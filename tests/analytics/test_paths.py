"""Paths users really have, in the analytics database: a home, an export directory, a replay
output and a database path holding glob characters, quotes, spaces, a trailing slash, or
reached through a symbolic link. Each view reads exactly its own files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.analytics.catalog import refresh
from pipeline.analytics.sandbox import QueryRefused, query
from pipeline.analytics.sources import (
    AnalyticsPaths,
    ExportSource,
    UnsupportedPath,
    discover_exports,
    parse_export_option,
)
from pipeline.jobs.export import ExportSpec, record_export
from pipeline.jobs.replay import LineageRecord
from pipeline.settings import load_settings
from tests.analytics.conftest import T0, nic_rows, write_export

MS = 1_000_000
QUARANTINED = [{"_segment": 0, "_offset": 1, "reason": "bad", "payload": b"{}"}]

#: a directory name, and a neighbour its name read as a DuckDB glob would also match
NEIGHBOURS = {
    "data[1]": "data1",
    "a*b": "a-other-b",
    "what?": "whatX",
    'it\'s "quoted" {x} %20 #1 ~ ünï': None,
}


def four_samples(host: str) -> list[dict]:
    times = [T0 + k * 1000 * MS for k in range(4)]
    return nic_rows(host, "eth0", times, [0, 1, 2, 3], [0, 1, 2, 3])


def write_replay(paths: AnalyticsPaths, output: Path, run_id: str, rows: int) -> None:
    """A replay's results and metrics in `output` and its lineage record in the home."""
    output.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"second": list(range(rows))}), output / "results.parquet")
    (output / "metrics.json").write_text(json.dumps({"run_id": run_id}))
    LineageRecord(
        run_id=run_id,
        slice_id="s-1",
        stream="examples/network",
        sensor=None,
        start_cut="v1~examples~network~0-0",
        end_cut="v1~examples~network~0-10",
        start_time_ns=0,
        end_time_ns=1,
        input_events=1,
        input_rows=rows,
        output_rows=rows,
        model="pipeline.models.nic:throughput",
        model_version="sha256:abc",
        output_dir=str(output),
        results_path=str(output / "results.parquet"),
        metrics_path=str(output / "metrics.json"),
        started_at="2026-11-01T00:00:00Z",
        finished_at="2026-11-01T00:00:01Z",
        params_hash="sha256:" + "0" * 64,
    ).write(paths.lineage_dir)


def analytics_home(tmp_path: Path, name: str, monkeypatch) -> AnalyticsPaths:
    """A home under a directory named `name`; its database outside it (a `?` is no place
    for a DuckDB database: `test_a_database_path_with_a_question_mark_is_refused`)."""
    config = tmp_path / "sluice.toml"
    config.write_text(f'[analytics]\ndatabase = "{tmp_path / "db" / "sluice.duckdb"}"\n')
    monkeypatch.setenv("SLUICE_CONFIG", str(config))
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / name / "home"))
    return AnalyticsPaths.from_settings(load_settings())


@pytest.mark.parametrize("name", list(NEIGHBOURS))
def test_every_view_reads_exactly_its_own_files_whatever_the_directory_names(
    tmp_path, monkeypatch, name
):
    """The home, an export outside it and a replay's --output each under a directory named
    `name`; beside each, a neighbour that `name` read as a glob would match, holding files
    of the same layout. Before, `[` read the neighbour's files instead (with no neighbour,
    the refresh failed: "No files found"), and `*` and `?` read them too: rows of another
    home, every row counted twice, a query refused by the sandbox."""
    paths = analytics_home(tmp_path, name, monkeypatch)
    places = [tmp_path / name, *([tmp_path / n] if (n := NEIGHBOURS[name]) else [])]
    for place in places:  # the neighbour first gets files of every kind, then the real one
        write_export(place / "home" / "exports" / "x", four_samples("inside"), QUARANTINED)
        write_export(place / "outside", four_samples("outside"))
        replay_output = place / "replay output"
        write_replay(AnalyticsPaths(place / "home", paths.database), replay_output, "rp-1", 3)
    inside = ExportSource("s/inside", paths.home / "exports" / "x", "s/inside", "NetworkSamples")
    outside = ExportSource("s/outside", tmp_path / name / "outside", "s/outside")

    refresh(paths, [inside, outside])

    samples = "SELECT export, count(*) FROM samples GROUP BY 1 ORDER BY 1"
    assert query(paths, samples)[1] == [("s/inside", 4), ("s/outside", 4)]
    rates = "SELECT export, count(*) FROM rates GROUP BY 1 ORDER BY 1"
    assert query(paths, rates)[1] == [("s/inside", 4), ("s/outside", 4)]
    assert query(paths, "SELECT count(*) FROM quarantine")[1] == [(1,)]
    assert query(paths, "SELECT run_id, count(*) FROM replays GROUP BY 1")[1] == [("rp-1", 3)]
    # a second refresh keeps every rates generation: the files it read are its own
    found: list[str] = []
    refresh(paths, [inside, outside], found.append)
    assert all("0 computed now" in line for line in found), found
    # the sandbox lets a query read the home's directories, not the neighbour's
    if NEIGHBOURS[name] is not None:
        neighbour = tmp_path / NEIGHBOURS[name] / "home" / "exports" / "x" / "date=*" / "**"
        with pytest.raises(QueryRefused, match=re.escape("Cannot access file")):
            query(paths, f"SELECT count(*) FROM read_parquet('{neighbour}')")


def test_a_database_path_with_a_question_mark_is_refused(tmp_path, monkeypatch):
    """DuckDB names the write-ahead log of `what?/x.duckdb` `what.wal?/x.duckdb`: the refresh
    failed at its commit, naming a file nobody asked for."""
    monkeypatch.setenv("SLUICE_HOME", str(tmp_path / "what?" / "home"))
    paths = AnalyticsPaths.from_settings(load_settings())
    said = f"analytics database {paths.database}: holds '?': DuckDB cannot keep a database there"
    with pytest.raises(UnsupportedPath, match=re.escape(said)):
        refresh(paths, [])
    assert not paths.home.exists()  # refused before anything was written
    with pytest.raises(UnsupportedPath, match=re.escape(said)):
        query(paths, "SELECT 1")


def test_an_export_reached_through_a_symbolic_link_is_one_export(tmp_path, monkeypatch):
    """A run recorded `--output /data/link`, the user named the target with --export: the
    views read the same files twice, and `samples` counted every row twice."""
    real = write_export(tmp_path / "real" / "parquet", four_samples("edge1")).parent
    link = tmp_path / "link"
    link.symlink_to(real)
    record_export(ExportSpec("s/net", "NetworkSamples", link, "embedded:/nowhere"))
    paths = AnalyticsPaths.from_settings(load_settings())
    given = parse_export_option(f"s/net={real}/")

    exports = discover_exports(load_settings(), [given])
    assert [(e.name, e.root, e.schema) for e in exports] == [("s/net", real, "NetworkSamples")]
    refresh(paths, exports)
    assert query(paths, "SELECT count(*) FROM samples")[1] == [(4,)]


def test_an_export_option_under_the_users_home_directory(tmp_path, monkeypatch):
    """`--export s/x=~/exports/x`: the shell leaves a `~` after `=` as it is, and the refresh
    looked for `./~/exports/x`."""
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    (tmp_path / "me" / "exports" / "x").mkdir(parents=True)
    assert parse_export_option("s/x=~/exports/x").root == tmp_path / "me" / "exports" / "x"


def test_a_copy_of_the_home_opens_under_any_name_and_a_trailing_slash(tmp_path, monkeypatch):
    """`SET VARIABLE sluice_home = '/copy [2]/'` in plain DuckDB: the views read the copy."""
    paths = analytics_home(tmp_path, "home", monkeypatch)
    write_export(paths.home / "exports" / "x", four_samples("edge1"), QUARANTINED)
    write_replay(paths, paths.replays_dir / "r", "rp-1", 3)
    refresh(paths, [ExportSource("s/x", paths.home / "exports" / "x", "s/x", "NetworkSamples")])
    copy = tmp_path / "copy [2]"
    paths.home.rename(copy)
    con = duckdb.connect(str(paths.database), read_only=True)
    con.execute("SET VARIABLE sluice_home = ?", [f"{copy}/"])
    views = ("s_x", "rates", "replays", "lineage")
    counts = [con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v in views]
    assert counts == [4, 4, 3, 1]
    assert con.execute("SELECT DISTINCT results_path FROM lineage").fetchone() == (
        f"{copy}/replays/r/results.parquet",
    )
