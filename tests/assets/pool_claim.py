"""One process's claim of a pool's slot, with the claim's two windows held open for a second
each (for test_pool_claims.py): between counting the free slots and queueing the step as
assigned one, and between finding a free slot row and taking it.

`python -m tests.assets.pool_claim DAGSTER_HOME RUN_ID GO` prints `ready`, waits for the file
GO, claims the slot of the pool `mirror` for RUN_ID as a run's step does, and prints the
outcome.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg

POOL = "mirror"
WINDOW_SECONDS = 1.0


class _Row:
    def __init__(self, row: Any) -> None:
        self._row = row

    def fetchone(self) -> Any:
        return self._row


class _SlowToTake:
    """A connection that pauses after finding a free slot, before the claim takes it."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, statement: Any, *args: Any) -> Any:
        result = self._conn.execute(statement, *args)
        text = str(statement)
        if "FROM concurrency_slots" in text and "step_key IS NULL" in text:
            row = result.fetchone()
            time.sleep(WINDOW_SECONDS)
            return _Row(row)
        return result


def main(home: str, run_id: str, go: Path) -> int:
    with dg.DagsterInstance.from_config(home) as instance:
        storage = instance.event_log_storage
        connect = storage.index_connection

        @contextmanager
        def slow_connection() -> Any:
            with connect() as conn:
                yield _SlowToTake(conn)

        take = storage._claim_concurrency_slot

        def slow_take(**claim: Any) -> Any:  # the step of the claim that finds and takes a slot
            storage.index_connection = slow_connection
            try:
                return take(**claim)
            finally:
                del storage.index_connection  # the class's own again

        storage._claim_concurrency_slot = slow_take
        count = storage.has_unassigned_slots

        def slow_count(key: str) -> bool:
            free = count(key)
            time.sleep(WINDOW_SECONDS)
            return free

        storage.has_unassigned_slots = slow_count
        storage.get_pool_limits()  # the tables exist before the race starts
        print("ready", flush=True)
        while not go.exists():
            time.sleep(0.005)
        storage.initialize_concurrency_limit_to_default(POOL)
        print(storage.claim_concurrency_slot(POOL, run_id, "mirror_step").slot_status.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
