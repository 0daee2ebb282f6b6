"""Reading never writes, and the schema explains itself: a query leaves the database file as it
was, whatever the shell's default store; times are one type; every view and column has a
comment; a copy of the home opens with one setting; replays are one row per result row."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.analytics.catalog import refresh
from pipeline.analytics.sandbox import query
from pipeline.analytics.snapshots import snapshot_slices
from pipeline.analytics.sources import AnalyticsPaths, discover_exports
from pipeline.jobs.replay import LineageRecord, hash_params_text
from pipeline.jobs.slices import SliceRecord, record_slices
from pipeline.settings import load_settings
from pipeline.streams import StreamCut, open_store
from tests.analytics.conftest import HOUR_NS, T0, nic_rows, write_export

REPO = Path(__file__).resolve().parents[2]
MS = 1_000_000
CONFIG = """
[stores.cloud]
embedded = "cloud"

[streams.network]
stream = "examples/network"
schema = "NetworkSamples"
[streams.network.mirror]
store = "cloud"
stream = "site/network"
[streams.network.bookmark]
burst_mbps = 5.0
"""


def refresh_all(settings) -> AnalyticsPaths:
    paths = AnalyticsPaths.from_settings(settings)
    refresh(paths, discover_exports(settings))
    return paths


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def a_slice(stream: str, start_ns: int, end_ns: int, end_offset: int = 400) -> SliceRecord:
    scope, name = stream.split("/")
    return SliceRecord.create(
        stream=stream,
        sensor=None,
        start_cut=StreamCut.of(scope, name, {0: 0}),
        end_cut=StreamCut.of(scope, name, {0: end_offset}),
        start_time_ns=start_ns,
        end_time_ns=end_ns,
        reason="test",
        created_by="test",
    )


@pytest.fixture
def configured(tmp_path, monkeypatch):
    """sluice.toml with a cloud store holding two slices, and an export under the home."""
    config = tmp_path / "sluice.toml"
    config.write_text(CONFIG)
    monkeypatch.setenv("SLUICE_CONFIG", str(config))
    settings = load_settings()
    times = [T0 + k * 1000 * MS for k in range(5)]
    rows = nic_rows("edge1", "eth0", times, [0, 125_000, 250_000, 375_000, 500_000], [0] * 5)
    write_export(settings.home / "exports" / "network" / "parquet", rows)
    with open_store(settings.stores["cloud"]) as cloud:
        cloud.create_stream("site/network")
        slices = [a_slice("site/network", T0, T0 + 2000 * MS), a_slice("site/network", T0, T0)]
        record_slices(cloud, slices, "sluice/slices")
    return settings


def test_sql_from_a_shell_with_another_default_store_leaves_the_database_unchanged(
    configured, tmp_path, capsys
):
    assert cli.main(["--store", f"embedded:{tmp_path / 'elsewhere'}", "analytics", "refresh"]) == 0
    assert "slices:   2" in capsys.readouterr().out  # from the cloud store of sluice.toml
    paths = AnalyticsPaths.from_settings(configured)
    counts = "SELECT (SELECT count(*) FROM slices), (SELECT count(*) FROM network)"
    views = "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY 1"
    before = (digest(paths.database), query(paths, counts)[1], query(paths, views)[1])
    assert before[1] == [(2, 5)]
    other = tmp_path / "other-store"
    env = {
        **os.environ,
        "SLUICE_STORE": f"embedded:{other}",
        "PYTHONPATH": str(REPO),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--store", f"embedded:{other}", "sql", counts],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines()[2].split() == ["2", "5"]
    assert cli.main(["sql", "SELECT * FROM slices"]) == 0
    after = (digest(paths.database), query(paths, counts)[1], query(paths, views)[1])
    assert after == before
    assert not other.exists()  # nothing opened the other store either


def test_sql_refuses_a_negative_max_rows_in_one_line(configured, capsys):
    assert cli.main(["analytics", "refresh"]) == 0
    paths = AnalyticsPaths.from_settings(configured)
    before = digest(paths.database)
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # argparse refuses it, naming the option
        cli.main(["sql", "--max-rows", "-1", "SELECT * FROM slices"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        "sluice sql: error: argument --max-rows: -1: rows to print: 0 (all) or more"
    )
    assert digest(paths.database) == before
    assert cli.main(["sql", "--max-rows", "0", "SELECT * FROM slices"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "(2 rows)"


def test_times_are_one_type_and_join_in_plain_duckdb(configured, tmp_path):
    paths = AnalyticsPaths.from_settings(configured)
    snapshot_slices(paths, [(a_slice("site/network", T0 + 1000 * MS, T0 + 3000 * MS), "s")])
    refresh_all(configured)
    types = query(
        paths,
        "SELECT DISTINCT data_type FROM duckdb_columns() WHERE NOT internal "
        "AND (column_name = 'time' OR column_name LIKE '%_time' OR column_name LIKE '%_at')",
    )[1]
    assert types == [("TIMESTAMP WITH TIME ZONE",)]
    views = query(paths, "SELECT view_name FROM duckdb_views() WHERE NOT internal")[1]
    for (view,) in views:
        columns = query(paths, f"DESCRIBE {view}")[1]
        assert ("time", "TIMESTAMP WITH TIME ZONE") in [c[:2] for c in columns], view
    script = (
        "import duckdb\n"
        f"con = duckdb.connect({str(paths.database)!r}, read_only=True)\n"
        "print(con.sql('SELECT count(*) FROM rates r JOIN slices s "
        "ON r.time BETWEEN s.start_time AND s.end_time').fetchall()[0][0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "3"  # the samples of seconds 1, 2 and 3


def test_every_view_and_column_has_a_comment(configured):
    paths = refresh_all(configured)
    views = query(paths, "SELECT view_name, comment FROM duckdb_views() WHERE NOT internal")[1]
    assert len(views) == 11 and all(comment for _, comment in views)
    columns = query(
        paths,
        "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE NOT internal",
    )[1]
    assert [c for c in columns if not c[2]] == []
    docs = {(t, c): comment for t, c, comment in columns}
    assert "Mbit/s" in docs[("rates", "rx_mbps")]
    assert "NetworkSamples field RxBytes" in docs[("network", "RxBytes")]


def test_a_copy_of_the_home_opens_with_one_setting(configured, tmp_path):
    paths = AnalyticsPaths.from_settings(configured)
    assert cli.main(["analytics", "refresh"]) == 0  # the two slices of the cloud store
    counts = "SELECT (SELECT count(*) FROM network), (SELECT count(*) FROM slices)"
    copy = tmp_path / "colleague" / "sluice-home"
    shutil.copytree(paths.home, copy)
    shutil.rmtree(paths.home)  # the original is gone: only the copy can answer
    script = (
        "import duckdb\n"
        f"con = duckdb.connect({str(copy / 'analytics' / 'sluice.duckdb')!r}, read_only=True)\n"
        f"con.execute(\"SET VARIABLE sluice_home = '{copy}'\")\n"
        f"print(con.sql({counts!r}).fetchall()[0])\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "(5, 2)"
    moved = AnalyticsPaths(copy, copy / "analytics" / "sluice.duckdb")
    assert query(moved, counts)[1] == [(5, 2)]  # SLUICE_HOME=<copy> sluice sql does the same


def _lineage(paths, run_id, results_dir, params, *, rows, version=2):
    results_dir.mkdir(parents=True, exist_ok=True)
    if rows is not None:
        table = pa.table({"second": [T0 // 10**9 + k for k in range(rows)], "n": list(range(rows))})
        pq.write_table(table, results_dir / "results.parquet")
    text = json.dumps(params, sort_keys=True)
    metrics = {"model": "m:f", "model_version": "v1", "params": params}
    if version == 2:
        metrics["run_id"] = run_id
    (results_dir / "metrics.json").write_text(json.dumps(metrics))
    record = LineageRecord(
        run_id=run_id,
        slice_id="sl-1",
        stream="site/network",
        sensor=None,
        start_cut="v1~site~network~0-0",
        end_cut="v1~site~network~0-400",
        start_time_ns=T0,
        end_time_ns=T0 + HOUR_NS,
        input_events=1,
        input_rows=1,
        output_rows=rows or 0,
        model="m:f",
        model_version="v1",
        output_dir=str(results_dir),
        results_path=str(results_dir / "results.parquet"),
        metrics_path=str(results_dir / "metrics.json"),
        started_at="2026-11-01T10:00:00.000Z",
        finished_at="2026-11-01T10:00:01.000Z",
        params=text,
        params_hash=hash_params_text(text),
        version=version,
    )
    path = record.write(paths.lineage_dir)
    if version == 1:  # as an older Sluice wrote it: no params_hash
        stored = json.loads(path.read_text())
        del stored["params_hash"]
        path.write_text(json.dumps(stored))


def test_replays_are_one_row_per_result_row_and_older_overwritten_runs_are_flagged(configured):
    paths = AnalyticsPaths.from_settings(configured)
    replays = paths.home / "replays" / "sl-1" / "m.f@v1"
    _lineage(paths, "rp-a", replays / "params-a", {"x": 1}, rows=3)
    _lineage(paths, "rp-b", replays / "params-b", {"x": 2}, rows=2)
    # an older Sluice wrote both parameter sets to one directory: the later run won
    old = paths.home / "replays" / "sl-1" / "m.f@v0"
    _lineage(paths, "rp-old1", old, {"x": 1}, rows=None, version=1)
    _lineage(paths, "rp-old2", old, {"x": 2}, rows=4, version=1)
    refresh(paths, [])
    lineage = query(
        paths, "SELECT run_id, results_current, params->>'x' FROM lineage ORDER BY run_id"
    )[1]
    assert lineage == [
        ("rp-a", True, "1"),
        ("rp-b", True, "2"),
        ("rp-old1", False, "1"),  # its results file holds rp-old2's rows now
        ("rp-old2", True, "2"),
    ]
    rows = query(paths, "SELECT run_id, count(*) FROM replays GROUP BY 1 ORDER BY 1")[1]
    assert rows == [("rp-a", 3), ("rp-b", 2), ("rp-old2", 4)]
    hashes = query(paths, "SELECT DISTINCT params_hash FROM lineage WHERE run_id = 'rp-old1'")[1]
    assert hashes == [(hash_params_text('{"x": 1}'),)]  # computed for a version 1 record


def test_an_export_written_anywhere_is_found_through_its_record(configured, tmp_path, capsys):
    from pipeline.jobs.export import ExportSpec, record_export

    outside = tmp_path / "data" / "net-export"
    times = [T0 + k * 1000 * MS for k in range(3)]
    write_export(outside / "parquet", nic_rows("edge9", "eth0", times, [0, 1, 2], [0, 0, 0]))
    spec = ExportSpec("site/other", "NetworkSamples", outside, "embedded:/x")
    first = record_export(spec)
    assert record_export(spec) == first  # one record per directory
    assert cli.main(["analytics", "refresh"]) == 0
    out = capsys.readouterr().out
    assert f"export:   site/other <- {outside / 'parquet'} (1 file)" in out
    assert query(
        AnalyticsPaths.from_settings(configured),
        "SELECT export, count(*) FROM samples GROUP BY 1 ORDER BY 1",
    )[1] == [("network", 5), ("site/other", 3)]


def test_when_nothing_is_found_sluice_says_where_it_looked(tmp_path, monkeypatch, capsys):
    config = tmp_path / "sluice.toml"
    config.write_text(CONFIG)
    monkeypatch.setenv("SLUICE_CONFIG", str(config))
    home = load_settings().home
    assert cli.main(["analytics", "refresh"]) == 0
    looked = home / "exports" / "network" / "parquet"
    assert f"export:   network <- {looked} (no files yet)" in capsys.readouterr().out
    assert cli.main(["sql", "SELECT count(*) FROM rates WHERE rx_mbps > 0"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[2].strip() == "0"
    assert cli.main(["sql", "SELECT * FROM rates"]) == 0
    captured = capsys.readouterr()
    assert "(0 rows)" in captured.out
    assert f"note: no exported files of network in {looked}" in captured.err
    assert cli.main(["sql", "SELECT * FROM lineage WHERE false"]) == 0
    assert "note:" not in capsys.readouterr().err  # no export is read: nothing to say of them
    assert cli.main(["sql", "SELECT * FROM network_quarantine"]) == 0
    assert f"note: no exported files of network in {looked}" in capsys.readouterr().err
    assert cli.main(["plot", "rates", "network"]) == 1
    err = capsys.readouterr().err
    assert f"0 samples exported: a rate needs two. Sluice looked in {looked} (0 files" in err
    assert "widen" not in err  # no window was given
