"""The export's files: where each kind goes, and what a task tells the driver about them.

    parquet/date=2020-12-30/hour=21/part-b00000042-t0001-f000.parquet
    csv/date=2020-12-30/hour=21/part-b00000042-t0001-f000.csv        (header row, RFC 4180)
    jsonl/date=2020-12-30/hour=21/part-b00000042-t0001-f000.jsonl
    _quarantine/part-b00000042-t0001-f000.parquet                    (raw payload + reason)
    _staging/                                                        (never read this)

Shared by the task side (`export_writer.py`, which stages files) and the driver side
(`export_sink.py`, which publishes them); light on purpose: the driver unpickles these messages.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pipeline.durable import fsync_path

STAGING = "_staging"
QUARANTINE = "_quarantine"
EXTENSIONS = {"parquet": "parquet", "csv": "csv", "jsonl": "jsonl"}
#: What running the export again does after its disk refused a write (`OutputNotWritable`):
#: the failed batch's files were staged and never published, or published from its ledger
#: record, which the re-run finishes (`export_sink.py`)
RERUN = "the export is exactly-once, so its next run finishes the batch and writes each row once"


@dataclass(frozen=True)
class StagedFile:
    """A complete file in staging: what it holds and where it goes (minus the name)."""

    staged: str
    kind: str  # parquet | csv | jsonl | quarantine
    bucket: str  # "date=YYYY-MM-DD/hour=HH" ("" for quarantine)
    rows: int
    bytes: int


def fsync_all(paths: Iterable[Path]) -> None:
    """fsync every file or directory of `paths`, all at once (threads): each is durable when
    this returns. On a disk that takes milliseconds per fsync, the fsyncs issued together
    share the journal's commits instead of waiting for one commit each, one after another."""
    todo = list(dict.fromkeys(paths))
    if len(todo) < 2:
        for path in todo:
            fsync_path(path)
        return
    with ThreadPoolExecutor(min(len(todo), 8)) as pool:
        list(pool.map(fsync_path, todo))  # list(): re-raise the first failure


def published_name(staged: StagedFile, batch_id: int, partition: int, number: int) -> str:
    """Where a staged file is published, relative to the output directory."""
    ext = EXTENSIONS.get(staged.kind, "parquet")
    name = f"part-b{batch_id:08d}-t{partition:04d}-f{number:03d}.{ext}"
    top = QUARANTINE if staged.kind == "quarantine" else staged.kind
    return "/".join(p for p in (top, staged.bucket, name) if p)
