"""The driver side of the `sluice-export` sink: publish a batch's staged files, exactly once.

Each task (`export_writer.py`) writes complete, fsynced files into `_staging/` and reports
them (`export_layout.py`). The driver's `commit(messages, batchId)` names them, records the
list in the batch ledger (`ledger.py`) and publishes each by `rename`, then marks the batch
done. Exactly-once files: DuckDB never sees a partial file (rename is atomic); a batch re-run
after a driver crash finds its ledger record and finishes the same renames; a batch already
done publishes nothing. A batch's files appear one rename after the other, not all at once
(`DESIGN.md`, "The export sink").
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from pipeline.outputs import refused_writes
from pipeline.spark.errors import BatchConflict
from pipeline.spark.export_layout import RERUN, STAGING, fsync_all, published_name
from pipeline.spark.export_writer import FilesMessage
from pipeline.spark.ledger import LEDGER_VERSION, BatchLedger, BatchPlan
from pipeline.spark.options import ExportOptions

if TYPE_CHECKING:
    import pyarrow as pa


def files_plan(messages: list[Any], batch_id: int) -> BatchPlan:
    """Final names for every staged file of the batch, in task order."""
    items = []
    for message in sorted(
        (m for m in messages if isinstance(m, FilesMessage)), key=lambda m: m.partition
    ):
        numbers: dict[str, int] = {}
        for staged in message.files:
            number = numbers[staged.kind] = numbers.get(staged.kind, -1) + 1
            final = published_name(staged, batch_id, message.partition, number)
            items.append(
                {
                    "staged": staged.staged,
                    "final": final,
                    "kind": staged.kind,
                    "rows": staged.rows,
                    "bytes": staged.bytes,
                }
            )
    stats = _message_stats(messages)
    stats["files"] = [i["final"] for i in items]
    stats["bytes"] = sum(i["bytes"] for i in items)
    return BatchPlan(version=LEDGER_VERSION, kind="files", items=items, stats=stats)


def _message_stats(messages: list[Any]) -> dict[str, Any]:
    found = [m for m in messages if isinstance(m, FilesMessage)]
    lows = [m.min_time_ns for m in found if m.min_time_ns is not None]
    highs = [m.max_time_ns for m in found if m.max_time_ns is not None]
    return {
        "events": sum(m.events for m in found),
        "rows": sum(m.rows for m in found),
        "quarantined": sum(m.quarantined for m in found),
        "min_event_time_ns": min(lows) if lows else None,
        "max_event_time_ns": max(highs) if highs else None,
    }


def publish_files(output: Path, plan: BatchPlan, state: str, batch_id: int) -> dict[str, Any]:
    """Rename every staged file of the plan into place (idempotent); return the batch's stats.

    Every directory a file goes to is made durable before any file is renamed into it, and
    every rename is durable before this returns; the fsyncs of each step go at once
    (`fsync_all`), not one after the other."""
    moves = []
    for item in plan["items"]:
        staged, final = Path(item["staged"]), output / item["final"]
        if staged.exists():
            moves.append((staged, final))
        elif not final.exists():
            reason = f"staged file {staged} is gone and {final} was never published"
            raise BatchConflict(state, batch_id, reason)
    directories = list(dict.fromkeys(final.parent for _, final in moves))
    make_all_dirs(directories)  # date=…/hour=…, durable before a file is renamed in
    for staged, final in moves:
        os.replace(staged, final)
    fsync_all(directories)
    return plan["stats"]


def make_all_dirs(directories: list[Path]) -> None:
    """Each of `directories` and whichever of their parents are missing, each new
    directory's name made durable (its parent fsynced, all the parents at once)."""
    missing: dict[Path, None] = {}
    for directory in directories:
        path = directory
        while path not in missing and not path.exists():
            missing[path] = None
            path = path.parent
    for path in sorted(missing, key=lambda p: len(p.parts)):
        path.mkdir(exist_ok=True)  # another process may create it at once
    fsync_all(path.parent for path in missing)


def commit_files(opts: ExportOptions, messages: list[Any], batch_id: int | None) -> dict:
    """Publish a batch's files exactly once (with a ledger) and clear the staging area. A
    disk that refuses a directory or a rename is `OutputNotWritable`: the ledger's record
    stays, and the batch's re-run finishes publishing it."""
    output = Path(opts.output)
    # A ledger-less batch write is numbered by the clock (milliseconds): unique, increasing.
    number = batch_id if batch_id is not None else time.time_ns() // 10**6
    plan = files_plan(messages, number)
    with refused_writes(output, RERUN):
        if opts.state is None or batch_id is None:
            stats = publish_files(output, plan, "(no ledger)", number)
        else:
            with BatchLedger(opts.state) as ledger:
                record = ledger.record(batch_id, plan)
                stats = publish_files(output, record.plan, opts.state, batch_id)
                if record.state != "done":
                    ledger.finish(batch_id, stats)
    shutil.rmtree(output / STAGING, ignore_errors=True)
    return stats


def abort_files(opts: ExportOptions, messages: list[Any]) -> None:
    for message in messages:
        if isinstance(message, FilesMessage):
            for staged in message.files:
                Path(staged.staged).unlink(missing_ok=True)


class ExportStreamWriter(DataSourceStreamArrowWriter):
    """Streaming export: exactly-once files through the batch ledger (module doc)."""

    def __init__(self, opts: ExportOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesMessage:
        from pipeline.spark.export_writer import export_task

        return export_task(self.opts, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        commit_files(self.opts, messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:
        abort_files(self.opts, messages)


class ExportBatchWriter(DataSourceArrowWriter):
    """One-shot export: exactly-once with `state` + `batchId`, else published directly."""

    def __init__(self, opts: ExportOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesMessage:
        from pipeline.spark.export_writer import export_task

        return export_task(self.opts, iterator)

    def commit(self, messages: list[Any]) -> None:
        commit_files(self.opts, messages, self.opts.batch_id)

    def abort(self, messages: list[Any]) -> None:
        abort_files(self.opts, messages)


__all__ = ["ExportBatchWriter", "ExportStreamWriter"]
