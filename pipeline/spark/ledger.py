"""The batch ledger: a small SQLite file that makes a sink's commit of a batch idempotent.

A driver-side commit of batch N: `record(N, plan)` records what the batch will publish (or
returns what was recorded first), the sink publishes it (each step idempotent), `finish(N,
stats)` marks it done; a re-run of a done batch publishes nothing. A sink that writes on the
driver records each attempt (`attempt`). One file next to each Spark checkpoint, WAL with
`synchronous=FULL`: a step that returned survives `kill -9` and a power cut (`DESIGN.md`)."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict

LEDGER_VERSION = 1
BatchState = Literal["intent", "done"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    batch_id     INTEGER PRIMARY KEY,
    state        TEXT NOT NULL CHECK (state IN ('intent', 'done')),
    kind         TEXT NOT NULL,
    plan         TEXT NOT NULL,
    stats        TEXT,
    recorded_ns  INTEGER NOT NULL,
    done_ns      INTEGER
);
"""


class BatchPlan(TypedDict):
    """What a batch publishes (`items`), and its counts; `kind` names the sink."""

    version: int
    kind: Literal["txns", "files", "driver-txn"]
    items: list[dict[str, Any]]
    stats: dict[str, Any]


@dataclass(frozen=True, slots=True)
class BatchRecord:
    batch_id: int
    state: BatchState
    plan: BatchPlan
    stats: dict[str, Any] | None
    recorded_ns: int
    done_ns: int | None


class BatchLedger:
    """Open (creating if needed) the ledger file at `path`."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        self.db.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('version', ?)", (str(LEDGER_VERSION),)
        )

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> BatchLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record(self, batch_id: int, plan: BatchPlan) -> BatchRecord:
        """Record the intent to publish `plan` as batch `batch_id`, or return the earlier record."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            found = self.get(batch_id)
            if found is None:
                self.db.execute(
                    "INSERT INTO batches(batch_id, state, kind, plan, recorded_ns)"
                    " VALUES (?, 'intent', ?, ?, ?)",
                    (batch_id, plan["kind"], json.dumps(plan), time.time_ns()),
                )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return found or self.get(batch_id)  # type: ignore[return-value]

    def attempt(self, batch_id: int, plan: BatchPlan) -> None:
        """Record `plan` as batch `batch_id`'s intent, replacing an earlier intent (whose
        transaction the caller found never published); a batch that is done is left alone."""
        self.db.execute(
            "INSERT INTO batches(batch_id, state, kind, plan, recorded_ns)"
            " VALUES (?, 'intent', ?, ?, ?)"
            " ON CONFLICT (batch_id) DO UPDATE SET kind = excluded.kind, plan = excluded.plan,"
            " recorded_ns = excluded.recorded_ns WHERE state = 'intent'",
            (batch_id, plan["kind"], json.dumps(plan), time.time_ns()),
        )

    def finish(self, batch_id: int, stats: dict[str, Any]) -> None:
        """Mark batch `batch_id` done, with the counts it published."""
        self.db.execute(
            "UPDATE batches SET state='done', stats=?, done_ns=? WHERE batch_id=?",
            (json.dumps(stats), time.time_ns(), batch_id),
        )

    def get(self, batch_id: int) -> BatchRecord | None:
        row = self.db.execute(
            "SELECT batch_id, state, plan, stats, recorded_ns, done_ns FROM batches"
            " WHERE batch_id=?",
            (batch_id,),
        ).fetchone()
        return _record(row) if row else None

    def batches(self, since: int = -1) -> list[BatchRecord]:
        """Every recorded batch with an id above `since`, in id order."""
        rows = self.db.execute(
            "SELECT batch_id, state, plan, stats, recorded_ns, done_ns FROM batches"
            " WHERE batch_id > ? ORDER BY batch_id",
            (since,),
        ).fetchall()
        return [_record(r) for r in rows]

    def unfinished(self, after: int) -> list[tuple[int, BatchState]]:
        """(batch id, state) of every batch not done, or recorded with an id above `after`."""
        rows = self.db.execute(
            "SELECT batch_id, state FROM batches WHERE state != 'done' OR batch_id > ?"
            " ORDER BY batch_id",
            (after,),
        ).fetchall()
        return [(int(batch_id), state) for batch_id, state in rows]


def _record(row: tuple) -> BatchRecord:
    batch_id, state, plan, stats, recorded_ns, done_ns = row
    return BatchRecord(
        batch_id=batch_id,
        state=state,
        plan=json.loads(plan),
        stats=json.loads(stats) if stats else None,
        recorded_ns=recorded_ns,
        done_ns=done_ns,
    )
