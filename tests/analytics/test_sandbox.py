"""Reading never writes: `sluice sql` and the Dagster resource read the database read-only,
inside DuckDB's sandbox; each refusal is one clear line and nothing is written."""

from __future__ import annotations

import hashlib
import re

import pytest

from pipeline import cli
from pipeline.analytics.catalog import refresh
from pipeline.analytics.sandbox import QueryRefused, query
from pipeline.analytics.sources import AnalyticsError, AnalyticsPaths, ExportSource
from pipeline.settings import load_settings
from resources.analytics import AnalyticsResource

SANDBOX = "sluice sql reads only Sluice's data directories"


@pytest.fixture
def paths(nic_export) -> AnalyticsPaths:
    paths = AnalyticsPaths.from_settings(load_settings())
    refresh(paths, [ExportSource("network", nic_export, "examples/network", "NetworkSamples")])
    return paths


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_under(*roots) -> set:
    return {p for root in roots for p in root.rglob("*")}


def refused(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line
    return err


def test_copy_to_a_file_is_refused_and_writes_nothing(paths, nic_export, tmp_path, capsys):
    before, files = digest(paths.database), files_under(paths.home, nic_export, tmp_path)
    target = tmp_path / "out.csv"
    err = refused(capsys, ["sql", f"COPY (SELECT * FROM rates) TO '{target}'"])
    assert err.startswith("sluice: error: refused: COPY reads or writes files; " + SANDBOX)
    # also into a directory the views read (DuckDB's allowed_directories would let it)
    inside = nic_export / "date=2026-11-01" / "evil.parquet"
    refused(capsys, ["sql", f"SELECT 1; COPY (SELECT 1) TO '{inside}' (FORMAT parquet)"])
    refused(capsys, ["sql", f"EXPORT DATABASE '{tmp_path / 'dump'}'"])
    assert not target.exists() and not inside.exists() and not (tmp_path / "dump").exists()
    assert digest(paths.database) == before
    assert files_under(paths.home, nic_export, tmp_path) == files


def test_reading_a_system_file_is_refused(paths, capsys):
    before = digest(paths.database)
    for sql in ("SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/hosts')"):
        err = refused(capsys, ["sql", sql])
        assert err.startswith('sluice: error: refused: Cannot access file "/etc/')
        assert SANDBOX in err
    # a view re-pointed outside the home is refused the same way
    with pytest.raises(QueryRefused, match=re.escape(SANDBOX)):
        query(paths, "SELECT * FROM read_parquet('/etc/../etc/*.parquet')")
    assert digest(paths.database) == before


def test_installing_or_loading_an_extension_is_refused(paths, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # where an INSTALL would download to
    for sql in ("INSTALL httpfs", "LOAD httpfs", "FORCE INSTALL spatial"):
        err = refused(capsys, ["sql", sql])
        assert err.startswith("sluice: error: refused: INSTALL and LOAD install or load")
    assert not (tmp_path / ".duckdb").exists()


def test_an_http_url_is_refused(paths, capsys):
    for url in ("http://127.0.0.1:9/x.parquet", "https://example.com/x.csv", "s3://b/x.parquet"):
        err = refused(capsys, ["sql", f"SELECT * FROM read_parquet('{url}')"])
        assert err.startswith(f'sluice: error: refused: Cannot access file "{url}"')


def test_the_sandbox_cannot_be_undone_from_a_query(paths, capsys):
    err = refused(capsys, ["sql", "SET enable_external_access = true"])
    assert err.startswith("sluice: error: refused: SET changes the session's settings")
    with pytest.raises(AnalyticsError, match="the configuration has been locked"):
        query(paths, "PRAGMA enable_profiling")


def test_empty_sql_is_a_clear_error(paths, capsys):
    for sql in ("", "  ", ";", "-- nothing"):
        err = refused(capsys, ["sql", sql])
        assert err.startswith("sluice: error: sluice sql: no SQL given: pass a statement")


def test_the_dagster_resource_gets_the_same_sandbox(paths):
    resource = AnalyticsResource(home=str(paths.home), database=str(paths.database))
    with resource.connect() as con:
        assert con.execute("SELECT count(*) FROM rates").fetchone() == (9,)
        assert con.execute("SELECT current_setting('enable_external_access')").fetchone() == (
            False,
        )
        with pytest.raises(Exception, match="Cannot access file"):
            con.execute("SELECT * FROM read_csv('/etc/passwd')")
        with pytest.raises(Exception, match="locked"):
            con.execute("SET enable_external_access = true")
    with (
        pytest.raises(AnalyticsError, match="the analytics resource only reads"),
        resource.connect(read_only=False),
    ):
        pass


def test_a_database_of_an_older_sluice_is_refused_with_what_to_do(paths):
    import duckdb

    with duckdb.connect(str(paths.database)) as con:
        con.execute("DROP MACRO sluice_catalog_version")
    expected = "no refresh of this Sluice has built its views (the first one failed, or an older"
    with pytest.raises(AnalyticsError, match=re.escape(expected)):
        query(paths, "SELECT 1")
    refresh(paths, [])
    assert query(paths, "SELECT 1")[1] == [(1,)]


def test_empty_sql_is_the_first_thing_said_even_before_a_database_exists(tmp_path, capsys):
    from pipeline.cli import main

    assert main(["sql", ""]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sluice: error: sluice sql: no SQL given"), err
