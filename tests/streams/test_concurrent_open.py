"""Processes that open a new embedded store at the same moment (a collector creating it while
`sluice store info` looks) each open it: none is refused with "database is locked"."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

from pipeline.streams import open_store

OPENERS = 6


def open_at(root: str, moment: float) -> str | None:
    """Open the store at `root` at `moment` (time.time(): one clock for all processes); the
    error, if it fails."""
    while time.time() < moment:
        pass
    try:
        with open_store(f"embedded:{root}") as store:
            store.list_streams()
    except Exception as exc:  # any failure is what the test reports
        return f"{type(exc).__name__}: {exc}"
    return None


def test_a_new_store_opened_by_several_processes_at_once_opens_in_each(tmp_path):
    context = multiprocessing.get_context("fork")
    failures = []
    pool = context.Pool(OPENERS)
    try:
        for attempt in range(30):
            root = tmp_path / f"store-{attempt}"
            moment = time.time() + 0.05
            failures += pool.starmap(open_at, [(str(root), moment)] * OPENERS)
            assert Path(root, "catalog.db").exists()
    finally:
        # Ended, not terminated: the forked workers inherit this test process's signal
        # handlers, and a SIGTERM handler another test left behind kept one from ending on
        # `terminate`, which then waited for it for ever.
        pool.close()
        pool.join()
    assert [f for f in failures if f] == []
