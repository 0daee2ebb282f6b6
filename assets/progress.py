"""How far a streaming job's checkpoint has got: its last committed batch and end cut.

Both ways of running the mirror and the export — a Dagster run that catches up
(`availableNow`) and a long-lived `sluice run … --continuous` service — advance the same
checkpoint directory (`pipeline/jobs/checkpoint.py`). This module reads it without taking
its lock, so a sensor can turn a running service's progress into materializations:

- the last batch Spark committed: the highest file name under `spark/commits/`;
- that batch's end cut: the last line of `spark/offsets/<batch>`, the `sluice` source's
  offset JSON `{"cut": "v1~…"}` (Spark's offset log, format `v1`);
- the batch's counts: the batch ledger (`ledger.sqlite`, `pipeline/spark/ledger.py`).

Spark writes a commit file only after the batch's sink commit returned, so a committed
batch is published (exactly-once, by the ledger) and its end cut is durable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import SluiceError
from pipeline.spark.ledger import BatchLedger
from pipeline.streams import StreamCut

OFFSET_LOG_VERSION = "v1"


class UnreadableCheckpoint(SluiceError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        msg = (
            f"cannot read the progress of checkpoint {path}: {reason} (was it written by "
            "another Spark version? run the job once with `sluice run` to see its error)"
        )
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class BatchTotals:
    """Counts the ledger recorded for a range of published batches."""

    batches: int = 0
    events: int = 0
    rows: int = 0
    quarantined: int = 0
    bytes: int = 0
    files: tuple[str, ...] = ()
    min_event_time_ns: int | None = None
    max_event_time_ns: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointProgress:
    """The last batch a checkpoint committed and the cut where it ended."""

    root: Path
    batch_id: int
    end_cut: StreamCut


def _batch_ids(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def committed_progress(root: Path) -> CheckpointProgress | None:
    """The checkpoint's last committed batch, or None before its first one."""
    commits = _batch_ids(root / "spark" / "commits")
    if not commits:
        return None
    batch_id = commits[-1]
    return CheckpointProgress(root, batch_id, batch_end_cut(root, batch_id))


def batch_end_cut(root: Path, batch_id: int) -> StreamCut:
    """The end cut of `batch_id`, from Spark's offset log."""
    path = root / "spark" / "offsets" / str(batch_id)
    try:
        lines = path.read_text().strip().splitlines()
    except OSError as exc:
        raise UnreadableCheckpoint(root, f"{path}: {exc.strerror}") from None
    if len(lines) < 3 or lines[0] != OFFSET_LOG_VERSION:
        raise UnreadableCheckpoint(root, f"{path} is not a {OFFSET_LOG_VERSION} offset log")
    try:
        offset = json.loads(lines[-1])
        return StreamCut.parse(offset["cut"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableCheckpoint(
            root, f"{path}: no stream cut in its source offset ({exc})"
        ) from None


def ledger_totals(root: Path, after: int, upto: int) -> BatchTotals:
    """Counts of the batches in (after, upto] that the ledger marked done."""
    path = root / "ledger.sqlite"
    if not path.exists():
        return BatchTotals()
    with BatchLedger(path) as ledger:
        records = [r for r in ledger.batches(since=after) if r.batch_id <= upto]
    stats = [r.stats or {} for r in records if r.state == "done"]
    files = tuple(f for s in stats for f in s.get("files", ()))
    lows = [int(s["min_event_time_ns"]) for s in stats if s.get("min_event_time_ns") is not None]
    highs = [int(s["max_event_time_ns"]) for s in stats if s.get("max_event_time_ns") is not None]
    return BatchTotals(
        batches=len(stats),
        events=sum(int(s.get("events", 0)) for s in stats),
        rows=sum(int(s.get("rows", s.get("events", 0))) for s in stats),
        quarantined=sum(int(s.get("quarantined", 0)) for s in stats),
        bytes=sum(int(s.get("bytes", 0)) for s in stats),
        files=files,
        min_event_time_ns=min(lows) if lows else None,
        max_event_time_ns=max(highs) if highs else None,
    )
