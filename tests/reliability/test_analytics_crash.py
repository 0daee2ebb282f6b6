"""Kill -9 a refresh of the analytics database while DuckDB creates the file; the next refresh
builds the views."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeline.analytics.catalog import refresh
from pipeline.analytics.sandbox import query
from pipeline.analytics.sources import AnalyticsPaths
from pipeline.settings import load_settings

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

#: The first refresh, dying while DuckDB writes the new file's headers: file writes past
#: 4 KiB fail (RLIMIT_FSIZE), DuckDB raises, and the process dies there, as a kill would.
DIES_CREATING = textwrap.dedent(
    """
    import os, resource, duckdb
    from pipeline.analytics.catalog import refresh
    from pipeline.analytics.sources import AnalyticsPaths
    from pipeline.settings import load_settings

    connect = duckdb.connect

    def dying_connect(*args, **kwargs):
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
        try:
            connect(*args, **kwargs)
        finally:
            os._exit(9)

    duckdb.connect = dying_connect
    refresh(AnalyticsPaths.from_settings(load_settings()), [])
    """
)


def test_kill9_while_the_first_refresh_creates_the_database(tmp_path):
    """A refresh killed while DuckDB writes a new database file leaves no file that every
    later refresh refuses ("not a valid DuckDB database"): the file appears whole or not at
    all, and the next refresh builds the views."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", DIES_CREATING], env=env, capture_output=True, text=True, check=False
    )
    assert out.returncode == 9, out.stderr
    paths = AnalyticsPaths.from_settings(load_settings())
    assert "samples" in refresh(paths, [])
    assert query(paths, "SELECT count(*) FROM samples")[1] == [(0,)]
