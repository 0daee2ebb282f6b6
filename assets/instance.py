"""The Dagster instance Sluice runs on: `$SLUICE_HOME/dagster`, with its `dagster.yaml`.

Its configuration keeps the streaming jobs from overlapping: every catch-up step declares a
pool of one slot (`assets/keys.py: pool`), and runs tagged `sluice/exclusive` are queued one
at a time per tag value (`assets/DESIGN.md` says why both).

Its event log is SQLite, as Dagster's default is, with one change: `PoolSafeSqliteEventLogStorage`
takes a pool's slot under a lock that every process on the machine shares. Dagster's SQLite
storage claims a slot in several statements (count the free slots, queue the step as assigned,
take a free slot row), so two processes claiming at once can both win one slot: two runs of
one streaming step then ran side by side (`tests/assets/test_pool_claims.py` shows it).

`python -m assets.instance` writes the file (if it is not there yet) and prints the
directory, for `DAGSTER_HOME=$(python -m assets.instance) dagster dev -w workspace.yaml`.
"""

from __future__ import annotations

import fcntl
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
import yaml
from dagster._core.storage.event_log import SqliteEventLogStorage

from assets.keys import EXCLUSIVE_TAG
from pipeline import durable
from pipeline.settings import SluiceSettings, load_settings


class PoolSafeSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's SQLite event log, whose pool slots are claimed and freed one process at a
    time: the methods that read and then change the pool tables hold `pools.lock` in the
    storage directory (an `flock`, released by the kernel when a process dies)."""

    def __init__(self, base_dir: str, inst_data: Any = None) -> None:
        super().__init__(base_dir, inst_data=inst_data)
        self._pool_lock_path = os.path.join(self._base_dir, "pools.lock")
        self._pool_mutex = threading.RLock()
        self._pool_depth = 0

    @classmethod
    def from_config_value(cls, inst_data: Any, config_value: Any) -> PoolSafeSqliteEventLogStorage:
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def _pools_locked(self) -> Iterator[None]:
        with self._pool_mutex:  # nested calls (a claim that frees) take the file lock once
            if self._pool_depth:
                self._pool_depth += 1
                try:
                    yield
                finally:
                    self._pool_depth -= 1
                return
            fd = os.open(self._pool_lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._pool_depth = 1
                try:
                    yield
                finally:
                    self._pool_depth = 0
            finally:
                os.close(fd)  # closing the only descriptor releases the lock

    def claim_concurrency_slot(
        self, concurrency_key: str, run_id: str, step_key: str, priority: int | None = None
    ) -> Any:
        with self._pools_locked():
            return super().claim_concurrency_slot(concurrency_key, run_id, step_key, priority)

    def free_concurrency_slots_for_run(self, run_id: str) -> None:
        with self._pools_locked():
            super().free_concurrency_slots_for_run(run_id)

    def free_concurrency_slot_for_step(self, run_id: str, step_key: str) -> None:
        with self._pools_locked():
            super().free_concurrency_slot_for_step(run_id, step_key)

    def assign_pending_steps(self, concurrency_keys: Sequence[str]) -> None:
        with self._pools_locked():
            super().assign_pending_steps(concurrency_keys)

    def initialize_concurrency_limit_to_default(self, concurrency_key: str) -> bool:
        with self._pools_locked():
            return super().initialize_concurrency_limit_to_default(concurrency_key)

    def set_concurrency_slots(self, concurrency_key: str, num: int) -> None:
        with self._pools_locked():
            super().set_concurrency_slots(concurrency_key, num)

    def delete_concurrency_limit(self, concurrency_key: str) -> None:
        with self._pools_locked():
            super().delete_concurrency_limit(concurrency_key)


def event_log_storage(home: Path) -> dict[str, Any]:
    """The `event_log_storage` entry: Dagster's default SQLite files under `home`, with pool
    claims that cannot race."""
    return {
        "module": __name__,
        "class": PoolSafeSqliteEventLogStorage.__name__,
        "config": {"base_dir": str(home.resolve() / "history" / "runs")},
    }


def instance_config(max_concurrent_runs: int = 4, home: Path | None = None) -> dict[str, Any]:
    """The `dagster.yaml` of Sluice's instance (`home`: where its SQLite storage lives, for an
    instance on SQLite)."""
    local = {}
    if home is not None:
        local = {
            "event_log_storage": event_log_storage(home),
            # runs forked by the warm run worker when one is running (`assets/run_worker.py`)
            "run_launcher": {"module": "assets.run_worker", "class": "SluiceRunLauncher"},
        }
    return {
        **local,
        "concurrency": {
            "pools": {"default_limit": 1, "granularity": "op"},
            "runs": {
                "max_concurrent_runs": max_concurrent_runs,
                "tag_concurrency_limits": [
                    {"key": EXCLUSIVE_TAG, "value": {"applyLimitPerUniqueValue": True}, "limit": 1}
                ],
            },
        },
        "telemetry": {"enabled": False},
    }


def prepare_dagster_home(path: Path) -> Path:
    """Create `path` with Sluice's `dagster.yaml` (unless one is there: a user's edits win)
    and its SQLite storage, so a webserver and a daemon started together do not race to
    create the same databases."""
    path.mkdir(parents=True, exist_ok=True)
    config = path / "dagster.yaml"
    if not config.exists() or _written_by_an_earlier_sluice(config):
        durable.write_text(config, yaml.safe_dump(instance_config(home=path), sort_keys=False))
    with dg.DagsterInstance.from_config(str(path)) as instance:
        instance.get_runs(limit=1)
        instance.get_asset_keys(limit=1)
        instance.all_instigator_state()
    return path


def _written_by_an_earlier_sluice(config: Path) -> bool:
    """Whether `config` is, unedited, the file an earlier Sluice wrote (the same limits, with
    Dagster's own event log and launcher): it then gets the pool-safe event log, on the same
    files, and the launcher that uses the warm run worker."""
    try:
        return yaml.safe_load(config.read_text()) == instance_config()
    except (OSError, yaml.YAMLError):
        return False


def sluice_instance(settings: SluiceSettings) -> dg.DagsterInstance:
    """The persistent instance under `$SLUICE_HOME/dagster` (created on first use)."""
    return dg.DagsterInstance.from_config(str(prepare_dagster_home(settings.dagster_home)))


def main() -> int:
    print(prepare_dagster_home(load_settings().dagster_home))
    return 0


if __name__ == "__main__":
    sys.exit(main())
