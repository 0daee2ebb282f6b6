"""`sluice collect status`: per instance, what its buffer file says.

Read from each instance's SQLite buffer (safe while the collector runs: WAL readers never
block the writer): buffer depth, the newest sample time committed to the stream and the lag
behind now, the oldest sample still waiting, shed and quarantined counts, the transaction
protocol (as configured, and as the sender last decided it for its store), transactions
awaiting a decision, and the last errors. Whether the instance runs is told by its lock.

Health (`healthy`, and `problems` saying why not; `sluice collect status --check` exits 1
unless every instance is healthy): the instance runs; its driver, if it keeps a connection
(MQTT), has not been disconnected for longer than `unhealthy_after_seconds`; its sender has
not been failing for that long, and its heartbeat is fresh. After the process ends, the
state shown is how it ended: a clean stop (with the signal and what was left), or an end
without one (a crash, SIGKILL, a power cut).
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from collectors.batch import format_timestamp
from collectors.buffer import PROMISED_UP_TO, held
from collectors.buffer.file import WAL_STATE, lost_wal, wal_path, why_without_tables
from collectors.buffer.status import read_counters, read_meta
from collectors.settings import CollectorSettings, InstanceSettings
from pipeline.wording import counted


@dataclass(frozen=True, slots=True)
class InstanceStatus:
    name: str
    driver: str
    stream: str
    buffer_file: str
    running: bool
    txn_protocol: str = "auto"  # as configured
    txn_protocol_used: str | None = None  # flush or commit, as the sender last decided
    sender_state: str | None = None
    depth_events: int = 0
    queued_samples: int = 0
    samples_read: int = 0  # by the driver: buffered, and shed on a full buffer
    capacity_events: int = 0
    pending_txns: int = 0
    doubtful_txns: int = 0
    doubtful_events: int = 0  # held for the operator: `sluice collect resolve`
    last_committed_ns: int | None = None
    lag_seconds: float | None = None
    oldest_buffered_ns: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    last_errors: list[dict] = field(default_factory=list)
    connected: bool | None = None  # None: the driver keeps no connection (or not yet)
    connection: str | None = None  # what it is connected to, or why not, and since when
    healthy: bool = False
    problems: list[str] = field(default_factory=list)
    last_stop: str | None = None  # how the last run ended, when it is not running

    def as_dict(self) -> dict:
        return asdict(self)


#: The sender writes its heartbeat every few seconds, and at least once per retry (backoff up
#: to 30 s): older than this (beyond unhealthy_after_seconds) means it is stuck.
HEARTBEAT_SLACK_SECONDS = 60.0


def collect_status(settings: CollectorSettings, now_ns: int | None = None) -> list[InstanceStatus]:
    now_ns = now_ns or time.time_ns()
    limit = settings.unhealthy_after_seconds
    return [instance_status(inst, now_ns, limit) for inst in settings.instances]


def instance_status(
    inst: InstanceSettings, now_ns: int, unhealthy_after: float = 60.0
) -> InstanceStatus:
    """One instance's status at `now_ns` (the wall clock: lag, timestamps); how long the
    running collector has been disconnected, failing or silent is measured by the monotonic
    clock it wrote beside each stamp, so a step of the wall clock (NTP) does not count."""
    base = {
        "name": inst.name,
        "driver": inst.driver,
        "stream": inst.stream,
        "buffer_file": str(inst.buffer_file),
        "capacity_events": inst.capacity_events,
        "txn_protocol": inst.txn_protocol,
        "running": _is_running(inst.buffer_file),
    }
    path = inst.buffer_file
    if not os.path.lexists(path):
        return InstanceStatus(**base, sender_state="never started", problems=["not running"])
    if not path.is_file():
        problem = f"buffer unreadable: {path} is not a file; check buffer_file"
        return InstanceStatus(**base, sender_state=problem, problems=[problem])
    wal_present = wal_path(path).exists()
    try:
        found = _read_file(path, wal_present, now_ns)
    except sqlite3.Error as exc:
        problem = _unreadable(path, exc)
        return InstanceStatus(**base, sender_state=problem, problems=[problem])
    meta = found.pop("meta")
    lost = None if base["running"] else lost_wal(path, meta.get(WAL_STATE), wal_present)
    if lost is not None:
        problem = f"buffer damaged: {lost}; `sluice collect` refuses it"
        found["sender_state"] = problem
        return InstanceStatus(**base, **found, problems=[problem])
    ages = _Ages(meta, now_ns, time.monotonic_ns())
    health = _health(base["running"], meta, ages, unhealthy_after)
    return InstanceStatus(**base, **found, **health)


def _read_file(path: Path, wal_present: bool, now_ns: int) -> dict:
    """`_read` in one snapshot (counters, depth and records agree). Without a write-ahead
    log there is nothing to merge: the file is read as it is (`immutable`), so that no
    empty log is made that would hide a lost one from the collector."""
    flags = "mode=ro" if wal_present else "mode=ro&immutable=1"
    conn = sqlite3.connect(f"{path.as_uri()}?{flags}", uri=True, timeout=10.0)
    try:
        conn.execute("BEGIN")
        return _read(conn, now_ns)
    finally:
        conn.close()


def _unreadable(path: Path, exc: sqlite3.Error) -> str:
    if "no such table" in str(exc) and path.is_file():
        return f"buffer damaged: {why_without_tables(path)}; `sluice collect` refuses it"
    if "malformed" in str(exc):
        return f"buffer damaged: SQLite reports {exc}; `sluice collect` refuses it"
    return f"buffer unreadable: {exc}"


@dataclass(frozen=True, slots=True)
class _Ages:
    """Seconds since a stamp the collector wrote (`KEY_ns`, wall clock), by the monotonic
    clock it wrote beside it (`KEY_mono_ns`: one clock for every process since boot, and a
    running collector was started in this boot) when there is one, else by the wall clock."""

    meta: dict[str, str]
    now_ns: int
    now_mono_ns: int

    def __call__(self, key: str) -> float | None:
        mono = _int(self.meta.get(f"{key}_mono_ns"))
        if mono:
            return (self.now_mono_ns - mono) / 1e9
        wall = _int(self.meta.get(f"{key}_ns"))
        return (self.now_ns - wall) / 1e9 if wall else None


def _health(running: bool, meta: dict[str, str], age: _Ages, limit: float) -> dict:
    """`healthy`, `problems`, the driver's connection and, when stopped, how it ended."""
    connected = {"1": True, "0": False}.get(meta.get("driver_connected", ""))
    since_ns = _int(meta.get("driver_since_ns"))
    connection = None
    if connected is not None:
        connection = meta.get("driver_detail", "")
        if since_ns:
            connection += f" (since {format_timestamp(since_ns)})"
    problems = []
    if not running:
        problems.append("not running")
        state = meta.get("sender_state")
        last_stop = meta.get("last_stop")
        stopped_at, started_at = _int(meta.get("last_stop_ns")), _int(meta.get("started_ns"))
        if state != "stopped" or not last_stop or stopped_at < started_at:
            doing = state or "starting"
            last_stop = f"ended without a clean stop (a crash, a kill or a power cut) while {doing}"
        return {
            "healthy": False,
            "problems": problems,
            "connected": None,
            "connection": None,
            "last_stop": last_stop,
        }
    disconnected = age("driver_since") if connected is False else None
    if disconnected is not None and disconnected > limit:
        detail = meta.get("driver_detail", "")
        problems.append(f"driver disconnected for {disconnected:.0f}s: {detail}")
    failing = age("sender_failing_since")
    if failing is not None and failing > limit:
        state = meta.get("sender_state", "")
        problems.append(f"sender failing for {failing:.0f}s: {state}")
    silent = age("heartbeat")
    if silent is not None and silent > limit + HEARTBEAT_SLACK_SECONDS:
        problems.append(f"sender silent for {silent:.0f}s (stuck?)")
    return {
        "healthy": not problems,
        "problems": problems,
        "connected": connected,
        "connection": connection,
        "last_stop": None,
    }


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _read(conn: sqlite3.Connection, now_ns: int) -> dict:
    (oldest,) = conn.execute("SELECT min(min_ns) FROM events").fetchone()
    holding = held(conn)
    queued_after = conn.execute(PROMISED_UP_TO).fetchone()[0]
    queued_samples = conn.execute(
        "SELECT coalesce(sum(samples), 0) FROM events WHERE id > ?", (queued_after,)
    ).fetchone()[0]
    states = dict(conn.execute("SELECT state, count(*) FROM txns GROUP BY state"))
    meta = read_meta(conn)
    counters = read_counters(conn)
    last = int(meta["last_committed_ns"]) if "last_committed_ns" in meta else None
    errors = [
        {"time": format_timestamp(t), "time_ns": t, "source": s, "message": m}
        for t, s, m in conn.execute(
            "SELECT time_ns, source, message FROM errors ORDER BY id DESC LIMIT 5"
        )
    ]
    return {
        "sender_state": meta.get("sender_state"),
        "txn_protocol_used": meta.get("txn_protocol"),
        "depth_events": holding.total,
        "queued_samples": queued_samples,
        "pending_txns": states.get("open", 0) + states.get("ready", 0),
        "doubtful_txns": states.get("doubtful", 0),
        "doubtful_events": holding.doubtful,
        "last_committed_ns": last,
        "lag_seconds": None if last is None else max(0.0, (now_ns - last) / 1e9),
        "oldest_buffered_ns": oldest,
        "samples_read": counters.get("samples_buffered", 0) + counters.get("samples_shed", 0),
        "counters": counters,
        "last_errors": errors,
        "meta": meta,
    }


def _is_running(buffer_file: Path) -> bool:
    lock = buffer_file.with_name(buffer_file.name + ".lock")
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:  # none, or its directory is not one: no collector holds it
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def format_status(statuses: list[InstanceStatus]) -> str:
    """A human-readable report, one block per instance."""
    blocks = []
    for s in statuses:
        c = s.counters
        if s.running:
            state = "running" + (f", sender {s.sender_state}" if s.sender_state else "")
            state += ", healthy" if s.healthy else f", UNHEALTHY: {'; '.join(s.problems)}"
        else:
            state = f"not running, {s.last_stop or s.sender_state}"
        lines = [
            f"{s.name} ({s.driver} -> {s.stream}): {state}",
            f"  buffer: {s.depth_events:,}/{counted(s.capacity_events, 'event')} "
            f"({counted(s.queued_samples, 'sample')} waiting), {s.buffer_file}",
            f"  read: {counted(s.samples_read, 'sample')}, buffered in "
            f"{counted(c.get('events_buffered', 0), 'event')}",
            f"  last committed sample: {_time(s.last_committed_ns)}"
            + (f" (lag {s.lag_seconds:.1f}s)" if s.lag_seconds is not None else ""),
            f"  oldest buffered sample: {_time(s.oldest_buffered_ns)}",
            f"  committed: {counted(c.get('samples_committed', 0), 'sample')} in "
            f"{counted(c.get('events_committed', 0), 'event')}, "
            f"{counted(c.get('txns_committed', 0), 'txn')}; "
            f"shed: {counted(c.get('samples_shed', 0), 'sample')}; "
            f"quarantined: {c.get('quarantined', 0):,}; "
            f"blocked: {c.get('blocked_ms', 0) / 1000:.1f}s",
            f"  transactions: {_protocol(s)}; awaiting commit: {s.pending_txns:,}; "
            f"doubtful: {s.doubtful_txns:,}; errors: {c.get('errors', 0):,}",
        ]
        if s.doubtful_txns:
            lines.append(doubtful_hint(s.name, s.doubtful_txns, s.doubtful_events))
        if s.connected is not None:
            lines.insert(1, f"  {'connected' if s.connected else 'NOT connected'}: {s.connection}")
        lines += [f"    {e['time']} {e['source']}: {e['message']}" for e in s.last_errors]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def doubtful_hint(name: str, txns: int, events: int) -> str:
    """What doubtful events are and what to do about them (status, and the shutdown log)."""
    return (
        f"  DOUBTFUL: {counted(events, 'event')} of {counted(txns, 'transaction')} the store "
        "no longer knows may or may not be in the stream; never sent automatically: "
        f"stop the collector and run `sluice collect resolve {name}` to check the stream "
        "and resend or drop them"
    )


def _protocol(s: InstanceStatus) -> str:
    """What the sender used (`commit protocol`), and the setting if it chose by the store."""
    if s.txn_protocol_used is None:
        return f"txn_protocol = {s.txn_protocol}, not connected yet"
    if s.txn_protocol_used == s.txn_protocol:
        return f"{s.txn_protocol_used} protocol"
    return f"{s.txn_protocol_used} protocol (txn_protocol = {s.txn_protocol})"


def _time(ns: int | None) -> str:
    return "none" if ns is None else format_timestamp(ns)
