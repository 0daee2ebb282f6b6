"""Fixtures shared by the whole suite: a fresh store per test, one Spark session per run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.settings import SluiceSettings, load_settings
from tests import disks
from tests.disks import SmallDisk

REPO = Path(__file__).resolve().parents[1]

#: The slow pass (`make test`: `-m slow -n 2 --maxschedchunk 1`) hands each xdist worker
#: two tests, then one more whenever it finishes one, in collection order. Longest first, so
#: that no 3-to-6-minute test starts last and runs alone while the other worker idles: this
#: table orders them, by the seconds each took on a quiet 2-core machine (update it from
#: `--durations` when a test's cost changes a lot). Keys are node ids or their prefixes.
SLOW_COST_SECONDS = {
    "tests/reliability/test_export_kill.py": 333,
    "tests/reliability/test_mirror_kill.py::test_mirror_driver_killed_at_random_points[tasks": 201,
    "tests/test_demo.py::test_make_demo_short": 186,
    "tests/reliability/test_mirror_kill.py::test_mirror_driver_killed_at_random_points[driver": 175,
    "tests/reliability/test_bookmark_kill.py": 158,
    "tests/assets/test_ui.py": 153,
    "tests/spark/test_connect.py::test_jobs_attach_to_the_server_and_survive_its_kill": 123,
    "tests/deploy/test_dagster_postgres.py": 120,
}
#: Slow tests not in the table that start a JVM (besides those marked `spark`): after the
#: table, before the store and collector crash tests.
STARTS_SPARK = (
    "tests/docs/test_guides.py",
    "tests/spark/test_class_archive.py",
    "tests/jobs/test_stopping.py",
    "tests/spark/test_connect_start.py",
)


def slow_rank(item: pytest.Item) -> tuple[int, float]:
    """Sort key: the table's tests by cost, descending, then Spark tests, then the rest."""
    if item.get_closest_marker("slow") is None:
        return (2, 0)
    for prefix, seconds in SLOW_COST_SECONDS.items():
        if item.nodeid.startswith(prefix):
            return (0, -seconds)
    spark = item.get_closest_marker("spark") or item.nodeid.startswith(STARTS_SPARK)
    return (1, 0) if spark else (2, 0)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=slow_rank)  # stable: tests of equal rank keep their order


@pytest.fixture(autouse=True)
def _sluice_home(tmp_path, monkeypatch):
    """Every test gets its own SLUICE_HOME, so nothing leaks between tests or into the repo."""
    home = tmp_path / "sluice-home"
    monkeypatch.setenv("SLUICE_HOME", str(home))
    monkeypatch.delenv("SLUICE_STORE", raising=False)
    # Every batch through Spark, so the Spark path's tests stay what they say; the tests of
    # small backlogs run without Spark ask for it (`tests/jobs/test_in_process.py`).
    monkeypatch.setenv("SLUICE_IN_PROCESS_BYTES", "0")
    return home


@pytest.fixture
def product_defaults(monkeypatch):
    """The product's defaults where the suite pins them: for the tests that run Sluice end to
    end as a user does (`make demo`, the deployment), small backlogs run in process."""
    monkeypatch.delenv("SLUICE_IN_PROCESS_BYTES")


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "streams"


@pytest.fixture
def store(store_dir):
    from pipeline.streams import open_store

    with open_store(f"embedded:{store_dir}") as s:
        yield s


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    """One Spark session (`local[2]`) for the whole run (per pytest-xdist worker: `make test`
    runs two), with the `sluice` sources registered.

    pyspark is imported here, not at module level, so tests that never ask for Spark do not
    pay for it (and the edge install can run its tests). Mark such tests `pytest.mark.spark`.

    The JVM, and the Python workers it starts (where the sources resolve their options), keep
    the environment of the moment it started, before any test's own SLUICE_HOME: it starts
    with a SLUICE_HOME of the run's own, so that a read without a `store` option opens no
    store in the checkout (the default home is `.sluice` under the working directory).
    """
    from pipeline.spark.session import SparkSettings, spark_session

    with pytest.MonkeyPatch.context() as env:
        env.setenv("SLUICE_HOME", str(tmp_path_factory.mktemp("spark-home")))
        session = spark_session(SparkSettings(master="local[2]", app_name="sluice-tests"))
    yield session
    session.stop()


#: The default SLUICE_HOME of a command run in the checkout: the suite must leave it alone.
CHECKOUT_HOME = REPO / ".sluice"
_checkout_home = pytest.StashKey[set[str]]()


def _listing(root: Path) -> set[str]:
    """`root` and every path under it (relative to its parent); empty if it does not exist."""
    if not root.is_dir():
        return set()
    return {root.name, *(str(p.relative_to(root.parent)) for p in root.rglob("*"))}


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_checkout_home] = _listing(CHECKOUT_HOME)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run if it wrote into the checkout's `.sluice` (a process that ran without its
    test's SLUICE_HOME): `make demo` after `make test` would refuse a home it did not write.
    Checked once, by the process that reports (pytest-xdist's controller, or pytest alone)."""
    if hasattr(session.config, "workerinput"):
        return
    made = sorted(_listing(CHECKOUT_HOME) - session.config.stash.get(_checkout_home, set()))
    if not made:
        return
    shown = ", ".join(made[:5]) + (f" and {len(made) - 5} more" if len(made) > 5 else "")
    message = (
        f"ERROR: the tests wrote into the checkout's default SLUICE_HOME: {shown} (a process"
        " ran without its test's SLUICE_HOME; `make demo` refuses a home it did not write)"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(message, red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def settings(_sluice_home: Path) -> SluiceSettings:
    """The repository's sluice.toml, with every store and output under the test's home."""
    return load_settings(REPO / "sluice.toml", environ={}, home=_sluice_home)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[SmallDisk]:
    """A real 1 MiB disk (a tmpfs; root only, else the test is skipped), unmounted after the
    test: for outputs on a full or read-only filesystem."""
    with disks.small_disk(tmp_path / "small-disk", "1m") as disk:
        if disk is None:
            pytest.skip("a small tmpfs disk needs root and mount")
        yield disk
