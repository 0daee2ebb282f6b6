"""Fixtures shared by the whole suite: a fresh store per test, one Spark session per run."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.settings import SluiceSettings, load_settings

REPO = Path(__file__).resolve().parents[1]

#: The Spark driver kill suites take 6-12 minutes each on 2 cores. They run first, paired so
#: that with `make test`'s `-n 2 --maxschedchunk 1` (each worker starts with two tests, then
#: takes one at a time) each worker starts with about the same load, and both finish
#: together instead of one waiting on the last long suite.
LONG_FIRST = (
    ("test_export_kill.py", None),
    ("test_mirror_kill.py", "driver"),
    ("test_mirror_kill.py", "tasks"),
    ("test_bookmark_kill.py", None),
    ("test_dagster_postgres.py", None),
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        callspec = getattr(item, "callspec", None)
        mode = callspec.params.get("commit_mode") if callspec is not None else None
        key = (item.path.name, mode)
        return LONG_FIRST.index(key) if key in LONG_FIRST else len(LONG_FIRST)

    items.sort(key=rank)  # stable: every other test keeps its order


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


@pytest.fixture
def settings(_sluice_home: Path) -> SluiceSettings:
    """The repository's sluice.toml, with every store and output under the test's home."""
    return load_settings(REPO / "sluice.toml", environ={}, home=_sluice_home)
