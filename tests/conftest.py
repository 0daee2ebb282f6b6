"""Fixtures shared by the whole suite: a fresh store per test, one Spark session per run."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _sluice_home(tmp_path, monkeypatch):
    """Every test gets its own SLUICE_HOME, so nothing leaks between tests or into the repo."""
    home = tmp_path / "sluice-home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.delenv("SLUICE_STORE", raising=False)
    return home


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "streams"


@pytest.fixture
def store(store_dir):
    from pipeline.streams import open_store

    with open_store(f"embedded:{store_dir}") as s:
        yield s


@pytest.fixture(scope="session")
def spark():
    """One Spark session (`local[2]`) for the whole run (per pytest-xdist worker: `make test`
    runs two), with the `sluice` sources registered.

    pyspark is imported here, not at module level, so tests that never ask for Spark do not
    pay for it (and the edge install can run its tests). Mark such tests `pytest.mark.spark`.
    """
    from pipeline.spark.session import SparkSettings, spark_session

    session = spark_session(SparkSettings(master="local[2]", app_name="sluice-tests"))
    yield session
    session.stop()
