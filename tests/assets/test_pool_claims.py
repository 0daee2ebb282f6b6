"""Two processes claim a pool's only slot at once: on Sluice's instance one of them gets it.

Dagster's own SQLite event log finds a free slot and takes it in two statements; held open
(`tests/assets/pool_claim.py` pauses between them), the window lets both processes take the
one slot. Sluice's instance claims under a lock every process shares (`assets/instance.py`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from assets.instance import PoolSafeSqliteEventLogStorage, instance_config, prepare_dagster_home
from tests.assets.conftest import REPO


def claim_at_once(home: Path) -> list[str]:
    go = home / "go"
    command = [sys.executable, "-m", "tests.assets.pool_claim", str(home)]
    procs = [
        subprocess.Popen([*command, f"run-{n}", str(go)], cwd=REPO, env=dict(os.environ),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for n in range(2)
    ]  # fmt: skip
    ready = [p.stdout.readline().strip() for p in procs if p.stdout]
    go.touch()
    done = [p.communicate(timeout=120) for p in procs]
    assert ready == ["ready", "ready"], [err for _, err in done]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in done]
    return sorted(out.strip() for out, _ in done)


def test_one_of_two_processes_gets_the_only_slot(tmp_path):
    home = prepare_dagster_home(tmp_path / "dagster")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert isinstance(instance.event_log_storage, PoolSafeSqliteEventLogStorage)
    assert claim_at_once(home) == ["BLOCKED", "CLAIMED"]


def test_dagsters_own_sqlite_storage_gives_it_to_both(tmp_path):
    """What the lock is there for: the same claims on the storage Dagster configures."""
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config()))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.event_log_storage).__name__ == "SqliteEventLogStorage"
        instance.get_runs(limit=1)
        instance.event_log_storage.get_pool_limits()
    if claim_at_once(home) != ["CLAIMED", "CLAIMED"]:
        pytest.fail("Dagster's SQLite storage no longer races: the pool lock may be dropped")


def test_an_unedited_older_instance_file_gets_sluices_storage_and_launcher(tmp_path):
    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance_config()))  # as written before
    edited = tmp_path / "edited"
    edited.mkdir()
    mine = {**instance_config(), "telemetry": {"enabled": True}}
    (edited / "dagster.yaml").write_text(yaml.safe_dump(mine))
    prepare_dagster_home(home)
    prepare_dagster_home(edited)
    assert yaml.safe_load((home / "dagster.yaml").read_text()) == instance_config(home=home)
    assert yaml.safe_load((edited / "dagster.yaml").read_text()) == mine  # a user's edits win
