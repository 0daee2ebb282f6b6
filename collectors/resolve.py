"""`sluice collect resolve NAME`: settle the doubtful events of a stopped instance.

A batch is doubtful when the store no longer knows the stream transaction that carried it
(PROTOCOL.md): whether it committed cannot be told from the buffer, so the collector keeps
its rows and never sends them by itself. The operator settles each doubtful transaction:

- `drop`: its events are in the stream (or not wanted): its rows and record go;
- `resend`: they are not: its rows move, in order, to the tail of the send queue and go at
  the next start, after the events queued before them. They were taken before events the
  stream already holds, so the stream receives them later than their order;
- `auto`: the stream decides. A transaction commits whole or not at all, and the buffer
  keeps each event's exact bytes, so reading the stream tells: every event found byte for
  byte (payload and routing key) means it committed (drop); none found, in a stream never
  truncated, means it did not (resend). Anything else (some found; none found but the
  stream's head was truncated, so they may have been removed; the store unreachable) cannot
  be told, and the transaction is left as it was, with the reason. Events of another writer
  with the same bytes would count as found: drivers' events carry their samples' times.
- `report` (no option): what the stream says of each, that is, what `auto` would do.

Delivery guarantee: whatever the operator decides, in one SQLite transaction per record;
`resend` of a batch that is in the stream duplicates it, `drop` of one that is not loses
it: `auto` decides only when the stream's content settles it. It runs only while no
collector holds the instance's buffer (its lock file), as the sender must not move rows
meanwhile.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from collectors.batch import format_timestamp
from collectors.buffer import Buffer
from collectors.buffer.schema import BufferedEvent, TxnRecord
from collectors.errors import BufferLocked, InstanceRunning
from collectors.instance import lock_buffer
from collectors.settings import InstanceSettings
from pipeline.config import FileModes
from pipeline.streams import StreamStore, StreamStoreError, open_store
from pipeline.wording import agreeing, counted

Action = Literal["report", "drop", "resend", "auto"]
Verdict = Literal["in", "absent", "unknown"]


@dataclass(frozen=True, slots=True)
class Finding:
    """What the stream says of one doubtful transaction's events: all `in` it, all
    `absent` from it, or `unknown` (with the reason)."""

    record: TxnRecord
    verdict: Verdict
    reason: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What `resolve` found and did: lines to print, and whether anything stays doubtful
    that the action was meant to settle."""

    lines: list[str]
    unsettled: int


def resolve(
    inst: InstanceSettings,
    action: Action,
    modes: FileModes | None = None,
    store_opener: Callable[[str], StreamStore] = open_store,
) -> Outcome:
    """Report or settle the doubtful transactions of `inst` (see the module docstring);
    `InstanceRunning` while a collector holds its buffer."""
    modes = modes or FileModes()
    command = f"sluice collect resolve {inst.name}"
    if not os.path.lexists(inst.buffer_file):
        return Outcome([f"{inst.name}: no buffer at {inst.buffer_file}: nothing doubtful"], 0)
    try:
        lock = lock_buffer(inst, modes.file)
    except BufferLocked:
        raise InstanceRunning(inst.name, inst.buffer_file, command) from None
    try:
        buffer = Buffer(inst.buffer_file, inst.capacity_events, file_mode=modes.file)
        try:
            return _resolve(inst, buffer, action, store_opener)
        finally:
            buffer.close()
    finally:
        os.close(lock)


def _resolve(
    inst: InstanceSettings,
    buffer: Buffer,
    action: Action,
    store_opener: Callable[[str], StreamStore],
) -> Outcome:
    records = buffer.ledger.doubtful()
    if not records:
        return Outcome([f"{inst.name}: no doubtful events"], 0)
    events = sum(r.events for r in records)
    lines = [f"{inst.name}: {counted(events, 'doubtful event')} in {_txns(len(records))}:"]
    rows = {r.txn_id: buffer.ledger.rows(r) for r in records}
    if action in ("report", "auto"):
        findings = search(inst.store, records, rows, store_opener)
    else:
        findings = [Finding(r, "unknown", f"not searched (--{action})") for r in records]
    unsettled = 0
    for finding in findings:
        record = finding.record
        lines.append(f"  {_describe(record)}")
        lines.append(f"    {finding.reason}")
        decided = _decide(action, finding)
        if decided == "drop":
            buffer.ledger.drop_doubtful(record)
            lines.append(f"    dropped its {counted(record.events, 'event')} from the buffer")
        elif decided == "resend":
            buffer.ledger.resend_doubtful(record)
            lines.append(
                f"    its {counted(record.events, 'event')} go to the tail of the send queue: "
                "the collector sends them at its next start"
            )
        elif action == "report":
            lines.append(f"    {_advice(finding, inst.name)}")
        else:
            unsettled += 1
            lines.append("    left doubtful: decide with --resend or --drop")
    return Outcome(lines, unsettled)


def _decide(action: Action, finding: Finding) -> Literal["drop", "resend"] | None:
    if action in ("drop", "resend"):
        return action
    if action == "auto" and finding.verdict == "in":
        return "drop"
    if action == "auto" and finding.verdict == "absent":
        return "resend"
    return None


def _advice(finding: Finding, name: str) -> str:
    command = f"sluice collect resolve {name}"
    if finding.verdict == "in":
        return f"--auto would drop them (`{command} --auto`, or --drop)"
    if finding.verdict == "absent":
        return f"--auto would resend them (`{command} --auto`, or --resend)"
    return f"--auto cannot decide: check the stream yourself, then `{command} --resend` or --drop"


def search(
    store_uri: str,
    records: list[TxnRecord],
    rows: dict[str, list[BufferedEvent]],
    store_opener: Callable[[str], StreamStore] = open_store,
) -> list[Finding]:
    """Read each doubtful transaction's stream once and look for its events, byte for byte."""
    try:
        with store_opener(store_uri) as store:
            return [_search(store, r, rows[r.txn_id]) for r in records]
    except StreamStoreError as exc:
        reason = f"cannot read the stream to tell: {type(exc).__name__}: {exc}"
        return [Finding(r, "unknown", reason) for r in records]


def _search(store: StreamStore, record: TxnRecord, rows: list[BufferedEvent]) -> Finding:
    stream = record.stream
    if len(rows) != record.events:
        reason = f"the buffer holds {counted(len(rows), 'row')} of its {record.events}"
        return Finding(record, "unknown", reason)
    if not store.stream_exists(stream):
        return Finding(record, "absent", f"not in the stream: {stream} does not exist")
    wanted = Counter((e.routing_key, e.payload) for e in rows)
    found = read = 0
    for event in store.read(stream):
        read += 1
        key = (event.routing_key, event.payload)
        if wanted[key] > 0:
            wanted[key] -= 1
            found += 1
    total = len(rows)
    where = f"{stream} ({counted(read, 'event')} read)"
    if found == total:
        which = "its event is" if total == 1 else f"all {total} events are"
        reason = f"in the stream: {which} in {where}, byte for byte"
        return Finding(record, "in", reason)
    if found:
        reason = (
            f"cannot tell: {found:,} of its {counted(total, 'event')} "
            f"{agreeing(found, 'is', 'are')} in {where}, but a "
            "transaction commits whole or not at all (were some written again by hand, or "
            "truncated away?)"
        )
        return Finding(record, "unknown", reason)
    truncated = _truncation(store, stream)
    if truncated:
        reason = f"cannot tell: none is in {where}, but {truncated}: they may have been removed"
        return Finding(record, "unknown", reason)
    which = "its event is not" if total == 1 else f"none of its {total:,} events is"
    reason = f"not in the stream: {which} in {where}"
    return Finding(record, "absent", reason)


def _truncation(store: StreamStore, stream: str) -> str | None:
    """Why the stream may have lost events from its head (truncated, or by retention)."""
    head = dict(store.head(stream).positions)
    if 0 not in head or any(offset > 0 for offset in head.values()):
        return f"its head was truncated (head cut {store.head(stream)})"
    return None


def _describe(record: TxnRecord) -> str:
    bounds = ""
    if record.min_ns is not None and record.max_ns is not None:
        bounds = f", samples {format_timestamp(record.min_ns)}..{format_timestamp(record.max_ns)}"
    return (
        f"transaction {record.txn_id}: {counted(record.events, 'event')} "
        f"({counted(record.samples, 'sample')}, buffer ids {record.first_id}..{record.last_id}"
        f"{bounds}) for {record.stream}"
    )


def _txns(count: int) -> str:
    return counted(count, "transaction") + " the store no longer knows"
