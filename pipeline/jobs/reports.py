"""What a run reports of its batches: a `BatchReport` per batch, read from a running query's
progress and the sink's ledger, and the reason a failed query gives, out of Spark's wrapping."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.spark.ledger import BatchLedger
from pipeline.streams import StreamCut

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What one micro-batch did."""

    job: str
    batch_id: int
    start_cut: str | None
    end_cut: str | None
    events: int
    rows: int
    quarantined: int
    lag_bytes: int | None
    duration_ms: int
    #: False for a small backlog run in the job's own process (`in_process.py`)
    spark: bool = True

    def line(self) -> str:
        lag = "?" if self.lag_bytes is None else f"{self.lag_bytes} B"
        events = f"{self.events} event{'s' if self.events != 1 else ''}"
        rows = f"{self.rows} row{'s' if self.rows != 1 else ''}"
        where = "" if self.spark else " (in this process, no Spark)"
        return (
            f"{self.job} batch {self.batch_id}{where}: {events}, {rows}, "
            f"{self.quarantined} quarantined, lag {lag}, {self.duration_ms} ms, "
            f"cuts {self.start_cut or 'start'} .. {self.end_cut}"
        )


_QUALIFIED = re.compile(r"^(?P<module>(?:[a-z_]\w*\.)+)(?P<cls>[A-Z]\w*): (?P<msg>.+)$")
_BUILTIN = re.compile(r"^(?P<cls>\w+(?:Error|Exception)): (?P<msg>.+)$")


def failure_reason(exc: BaseException) -> str:
    """The Python error inside Spark's wrapping: a Sluice error's own message if there is one."""
    lines = [line.strip() for line in str(exc).splitlines()]
    qualified = [m for line in lines if (m := _QUALIFIED.match(line))]
    ours = [m for m in qualified if m.group("module").startswith("pipeline.")]
    if ours:
        return ours[-1].group("msg")
    found = qualified or [m for line in lines if (m := _BUILTIN.match(line))]
    if found:
        return f"{found[-1].group('cls')}: {found[-1].group('msg')}"
    return lines[0] if lines else type(exc).__name__


def collect_reports(
    job: str,
    query: StreamingQuery,
    context: tuple[Path | None, str | None],
    seen: dict[int, BatchReport],
    report: Callable[[BatchReport], None],
) -> None:
    ledger, first_start = context
    for progress in query.recentProgress:
        batch_id = int(progress["batchId"])
        if batch_id in seen or not progress["sources"]:
            continue
        source = progress["sources"][0]
        start, end = _cut(source.get("startOffset")), _cut(source.get("endOffset"))
        if start is not None and start == end:
            continue  # an idle trigger: no batch ran
        start = start or first_start
        events, rows, quarantined = batch_counts(ledger, batch_id, _input_rows(progress))
        done = BatchReport(
            job=job,
            batch_id=batch_id,
            start_cut=start,
            end_cut=end,
            events=events,
            rows=rows,
            quarantined=quarantined,
            lag_bytes=_lag(end, _cut(source.get("latestOffset"))),
            duration_ms=int(progress["batchDuration"]),
        )
        seen[batch_id] = done
        report(done)


def batch_counts(ledger: Path | None, batch_id: int, input_rows: int) -> tuple[int, int, int]:
    """A batch's events, rows and quarantined events: from the sink's ledger when it has
    them, else its input rows (a sink that reads the store itself, as the export, gets range
    rows: its ledger counts the events)."""
    stats = _ledger_stats(ledger, batch_id)
    events = int(stats["events"]) if "events" in stats else input_rows
    return events, int(stats.get("rows", events)), int(stats.get("quarantined", 0))


def _input_rows(progress: Any) -> int:
    """A batch's input rows. Spark Connect's progress leaves the total out (`null`): it is
    then the sum of its sources' (as pyspark's own `numInputRows` property sums them)."""
    total = progress["numInputRows"]
    if total is None:
        total = sum(int(source.get("numInputRows") or 0) for source in progress["sources"])
    return int(total)


def _cut(offset: Any) -> str | None:
    if offset is None:
        return None
    if isinstance(offset, str):
        offset = json.loads(offset)
    return offset.get("cut") if isinstance(offset, dict) else None


def _lag(end: str | None, latest: str | None) -> int | None:
    if end is None or latest is None:
        return None
    return StreamCut.parse(end).bytes_until(StreamCut.parse(latest))


def _ledger_stats(ledger: Path | None, batch_id: int) -> dict[str, Any]:
    if ledger is None or not ledger.exists():
        return {}
    with BatchLedger(ledger) as opened:
        record = opened.get(batch_id)
    return dict(record.stats or {}) if record is not None else {}
