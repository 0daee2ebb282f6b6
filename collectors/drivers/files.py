"""Files driver: CSV or Parquet files dropped into directories, each ingested exactly once.

Settled files are taken in name order, checked whole (`collectors/tabular.py`: a bad one goes
to the failed folder with its reason), batched into events and buffered, then deleted, moved
or remembered. Delivery guarantee: **exactly-once per file**, across crashes at any point:
each SQLite commit that buffers rows of a file also records how far the file got
(`FileRecord`), so a restart resumes after the last buffered row and a done file is not
taken again. A done file that is still in place and grows by whole CSV rows (the bytes
already ingested unchanged: their SHA-256 is kept) is ingested from the row where it stopped;
any other change to it goes to the failed folder with the reason, never ingested twice.
Details and settings: DRIVERS.md next to this file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from collectors.batch import encode_json
from collectors.drivers.base import (
    Appended,
    DriverContext,
    DriverSettings,
    OptionsReader,
    PendingEvent,
)
from collectors.errors import DriverError
from collectors.tabular import TIME_UNITS, BadFile, TableFormat, rows, validate
from pipeline.streams import MAX_EVENT_SIZE
from pipeline.wording import counted

EVENTS_PER_COMMIT = 100
#: ... and at most about this many bytes of events per commit: the events of a commit are held
#: in memory, and 100 events of a wide file's rows (each up to the store's 8 MiB) are 800 MB.
BYTES_PER_COMMIT = 32 << 20
FILE_STATE_VERSION = 2  # 2: `digest`, the SHA-256 of the bytes ingested
_IN_PROGRESS_SUFFIXES = (".tmp", ".part", ".partial", "~")

FILES_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY,
    version INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('ingesting', 'done')),
    rows_done INTEGER NOT NULL,
    events INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    digest TEXT
)
"""
_HASH_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Options:
    directories: tuple[Path, ...]
    table: TableFormat
    extension: str
    settle_ms: int
    scan_interval_ms: int
    delete_completed: bool
    completed_dir: Path | None
    failed_dir: Path | None


@dataclass(frozen=True, slots=True)
class FileRecord:
    """A row of `files` in the buffer (version 1): how far a file's ingestion got."""

    path: str
    size: int
    mtime_ns: int
    inode: int
    state: Literal["ingesting", "done"]
    rows_done: int
    events: int
    digest: str | None = None  # SHA-256 of the file's first `size` bytes (None before v2)

    def same_file(self, st: os.stat_result) -> bool:
        return (self.size, self.mtime_ns, self.inode) == (st.st_size, st.st_mtime_ns, st.st_ino)


def parse_options(r: OptionsReader) -> Options:
    kind = r.choice("format", ("csv", "parquet"), "csv")
    time_column = r.text("time_column", None)
    table = TableFormat(
        kind=kind,
        time_column=time_column,
        time_unit=r.choice("time_unit", tuple(TIME_UNITS), "ns"),
        delimiter=r.character("delimiter", ","),
    )
    if table.delimiter in '"\r\n':
        r.fail("delimiter", "must be one character other than a quote or a line end")
    if r.has("when_full") and r.text("when_full") == "shed":
        r.fail("when_full", "cannot be shed for files", "files wait on disk: use block")
    extension = r.text("extension", kind).lstrip(".")
    directories = r.texts("directories")
    if not all(directories):
        r.fail("directories", "has an empty entry", "list the directories files are dropped into")
    options = Options(
        directories=tuple(dict.fromkeys(Path(d).expanduser().absolute() for d in directories)),
        table=table,
        extension=extension or kind,
        settle_ms=r.integer("settle_ms", 5000, minimum=0),
        scan_interval_ms=r.integer("scan_interval_ms", 1000, minimum=10),
        delete_completed=r.flag("delete_completed", False),
        completed_dir=_folder(r, "completed_dir"),
        failed_dir=_folder(r, "failed_dir"),
    )
    if options.delete_completed and options.completed_dir is not None:
        r.fail("completed_dir", "is set with delete_completed = true", "set only one of them")
    return options


def _folder(r: OptionsReader, key: str) -> Path | None:
    """`completed_dir` or `failed_dir`: absolute, and not one of the watched directories."""
    if not r.has(key):
        return None
    folder = r.path(key).absolute()
    watched = {Path(d).expanduser().absolute() for d in r.texts("directories")}
    if folder in watched:
        r.fail(key, "is one of the directories", "use a folder that is not watched")
    return folder


def create(settings: DriverSettings) -> FilesDriver:
    options: Options = settings.options
    for directory in options.directories:
        if directory.is_dir():
            continue
        if directory.is_file():
            problem = f"directories entry {directory} is a regular file, not a directory"
        elif directory.exists():
            problem = f"directories entry {directory} is not a directory"
        else:
            problem = f"directory {directory} does not exist"
            if any(c in str(directory) for c in "*?["):
                problem += " (patterns are not expanded: list each directory)"
        problem += " (set directories / FILE_SPEC to directories the files are dropped into)"
        raise DriverError(settings.name, "files", problem)
    for key in ("completed_dir", "failed_dir"):
        folder = getattr(options, key)
        if folder is not None and folder.exists() and not folder.is_dir():
            problem = f"{key} {folder} exists and is not a directory"
            raise DriverError(settings.name, "files", problem)
    return FilesDriver(settings)


class FilesDriver:
    """Scans directories and ingests each settled file exactly once."""

    def __init__(self, settings: DriverSettings) -> None:
        self.settings = settings
        self.options: Options = settings.options
        default_failed = settings.buffer_file.parent / f"{settings.name}.failed"
        self.failed_dir = self.options.failed_dir or default_failed
        # path -> (size, mtime, inode) and the monotonic time it was first seen so
        self._seen: dict[str, tuple[tuple[int, int, int], float]] = {}

    def run(self, ctx: DriverContext) -> None:
        ctx.buffer.write(_create_table)
        while ctx.running:
            for path in self._candidates():
                if not ctx.running:
                    return
                self._process(ctx, path)
            self._prune(ctx)
            ctx.wait(self.options.scan_interval_ms / 1000.0)

    # --- finding files ----------------------------------------------------------------
    def _candidates(self) -> list[Path]:
        """Wanted files that have settled: their size, mtime and inode unchanged for
        `settle_ms` on the monotonic clock (the wall clock may step; mtimes may lie)."""
        now = time.monotonic()
        seen: dict[str, tuple[tuple[int, int, int], float]] = {}
        found = []
        for directory in self.options.directories:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue  # the directory went away: nothing to take from it now
            for entry in entries:
                st = self._wanted(entry)
                if st is None:
                    continue
                key = (st.st_size, st.st_mtime_ns, st.st_ino)
                before = self._seen.get(entry.path)
                seen[entry.path] = before if before and before[0] == key else (key, now)
                if now - seen[entry.path][1] >= self.options.settle_ms / 1000.0:
                    found.append(Path(entry.path))
        self._seen = seen
        return sorted(found, key=lambda p: (p.name, str(p)))

    def _wanted(self, entry: os.DirEntry) -> os.stat_result | None:
        name = entry.name
        if name.startswith(".") or name.endswith(_IN_PROGRESS_SUFFIXES):
            return None
        if not name.endswith("." + self.options.extension):
            return None
        try:
            st = entry.stat()
        except OSError:
            return None
        return st if entry.is_file() else None

    # --- one file ---------------------------------------------------------------------
    def _process(self, ctx: DriverContext, path: Path) -> None:
        try:
            st = path.stat()
        except FileNotFoundError:
            self._vanished(ctx, path)
            return
        record = _lookup(ctx, path)
        if record is not None and record.state == "done" and not self._taken_again(ctx, st, record):
            return
        if record is not None and record.state == "ingesting" and not record.same_file(st):
            self._changed(ctx, path, record)
            return
        try:
            validate(path, self.options.table)
            ctx.failpoints.hit("files.after_validate")
            if path.stat().st_mtime_ns != st.st_mtime_ns:
                return  # written to while we read it: take it when it has settled
            self._ingest(ctx, path, st, record)
        except BadFile as exc:
            if _unchanged_stat(path, st):
                self._fail(ctx, path, str(exc), record)
            # else written to while we read it: judged again when it has settled
        except FileNotFoundError:
            self._vanished(ctx, path)
        except OSError as exc:  # unreadable (permissions, I/O): the other files go on
            ctx.error("file", f"cannot read {path}: {exc}; tried again at the next scan")

    def _taken_again(self, ctx: DriverContext, st: os.stat_result, record: FileRecord) -> bool:
        """For a file done before: True if it grew by rows to take; else it is completed
        (unchanged, or only touched) or failed (changed), and False."""
        path = Path(record.path)
        change = "same" if record.same_file(st) else self._change(path, st, record)
        if change == "grown":
            return True
        if change == "changed":
            reason = (
                "it changed after it was ingested (only CSV rows appended to it are taken); "
                "drop it again under a new name to ingest it as a new file"
            )
            self._fail(ctx, path, reason, record)
            return False
        if change == "touched":
            ctx.buffer.write(lambda c: _save(c, _restat(record, st)))
        self._completed(ctx, path)
        return False

    def _change(self, path: Path, st: os.stat_result, record: FileRecord) -> str:
        """How a done file differs from what was ingested: `touched` (same bytes), `grown`
        (whole CSV rows appended, the rest unchanged) or `changed`."""
        if record.digest is None or st.st_size < record.size:
            return "changed"
        try:
            with path.open("rb") as fh:
                digest = _sha256(fh, record.size)
                fh.seek(max(0, record.size - 1))
                at_row_end = record.size == 0 or fh.read(1) in (b"\n", b"\r")
        except FileNotFoundError:
            return "changed"
        if digest != record.digest:
            return "changed"
        if st.st_size == record.size:
            return "touched"
        grows = self.options.table.kind == "csv" and at_row_end
        return "grown" if grows else "changed"

    def _ingest(
        self, ctx: DriverContext, path: Path, st: os.stat_result, record: FileRecord | None
    ) -> None:
        with path.open("rb") as fh:
            digest = _sha256(fh, st.st_size)
        if not _unchanged_stat(path, st):
            return  # written to meanwhile: taken when it has settled again
        start = record.rows_done if record else 0
        if record is not None and record.state == "done":
            ctx.log.info("%s grew after it was ingested: taking it from row %d", path, start)
        state = FileRecord(
            str(path),
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
            "ingesting",
            start,
            record.events if record else 0,
            digest,
        )
        chunk: list[PendingEvent] = []
        per_commit, held = min(EVENTS_PER_COMMIT, ctx.buffer.capacity_events), 0
        for event in self._events(path, st, start):
            chunk.append(event)
            held += len(event.payload)
            if len(chunk) >= per_commit or held >= BYTES_PER_COMMIT:
                state = self._commit(ctx, chunk, state, done=False)
                if state is None or not self._unchanged(ctx, path, st, state):
                    return
                chunk, held = [], 0
                if not ctx.running:
                    return  # stopping: a restart resumes after the rows just committed
        final = self._commit(ctx, chunk, state, done=True)
        if final is not None:
            rows, events = counted(final.rows_done, "row"), counted(final.events, "event")
            ctx.log.info("ingested %s: %s in %s", path, rows, events)
            ctx.buffer.add_counters({"files_done": 1})
            self._completed(ctx, path)

    def _events(self, path: Path, st: os.stat_result, start: int) -> Iterator[PendingEvent]:
        per_event = self.settings.samples_per_event
        batch: list[dict] = []
        times: list[int] = []
        for row, time_ns in rows(path, self.options.table, start):
            batch.append(row)
            times.append(st.st_mtime_ns if time_ns is None else time_ns)
            if len(batch) >= per_event:
                yield from self._event(batch, times)
                batch, times = [], []
        if batch:
            yield from self._event(batch, times)

    def _event(self, batch: list[dict], times: list[int]) -> Iterator[PendingEvent]:
        """The rows as one event, or halved until each part fits the store's event limit
        (`tabular.validate` refused any single row that cannot fit)."""
        payload = encode_json(batch)
        if len(payload) > MAX_EVENT_SIZE and len(batch) > 1:
            half = len(batch) // 2
            yield from self._event(batch[:half], times[:half])
            yield from self._event(batch[half:], times[half:])
            return
        key = self.settings.routing_key
        yield PendingEvent(payload, key, min(times), max(times), len(batch))

    def _commit(
        self, ctx: DriverContext, events: list[PendingEvent], state: FileRecord, done: bool
    ) -> FileRecord | None:
        """Buffer `events` and the file's new progress in one SQLite commit."""
        new = FileRecord(
            state.path,
            state.size,
            state.mtime_ns,
            state.inode,
            "done" if done else "ingesting",
            state.rows_done + sum(e.samples for e in events),
            state.events + len(events),
            state.digest,
        )
        if ctx.append(events, hook=lambda c: _save(c, new)) is not Appended.STORED:
            return None  # stopping while the buffer is full: resume from the last commit
        ctx.failpoints.hit("files.after_chunk")
        return new

    def _unchanged(
        self, ctx: DriverContext, path: Path, st: os.stat_result, state: FileRecord
    ) -> bool:
        try:
            now = path.stat()
        except FileNotFoundError:
            now = None
        if now is not None and state.same_file(now):
            return True
        self._changed(ctx, path, state)
        return False

    # --- endings ----------------------------------------------------------------------
    def _completed(self, ctx: DriverContext, path: Path) -> None:
        try:
            if self.options.delete_completed:
                path.unlink()
            elif self.options.completed_dir is not None:
                _move(path, self.options.completed_dir)
            else:
                return
        except FileNotFoundError:
            return
        ctx.failpoints.hit("files.after_cleanup")

    def _fail(self, ctx: DriverContext, path: Path, reason: str, record: FileRecord | None) -> None:
        """Move a bad file to the failed folder, its reason written beside it first."""
        if record is not None and record.rows_done:
            reason += f" ({record.rows_done} earlier rows of it were already sent)"
        self.failed_dir.mkdir(parents=True, exist_ok=True)
        target = _free_name(self.failed_dir / path.name)
        note = target.with_name(target.name + ".reason.txt")
        note.write_text(f"{path}\n{reason}\ninstance {self.settings.name}, {time.ctime()}\n")
        try:
            _move(path, self.failed_dir, target)
        except FileNotFoundError:
            note.unlink(missing_ok=True)
            self._vanished(ctx, path)
            return
        if record is not None:
            _forget(ctx, path)
        ctx.error("file", f"{path} moved to {target}: {reason}", every=0.0)
        ctx.buffer.add_counters({"files_failed": 1})

    def _changed(self, ctx: DriverContext, path: Path, record: FileRecord) -> None:
        reason = "the file changed while it was being ingested"
        if path.exists():
            self._fail(ctx, path, reason, record)
        else:
            _forget(ctx, path)
            sent = counted(record.rows_done, "row")
            ctx.error("file", f"{path} disappeared after {sent} were sent")

    def _vanished(self, ctx: DriverContext, path: Path) -> None:
        ctx.log.warning("%s disappeared before it was read: skipped", path)
        ctx.buffer.add_counters({"files_vanished": 1})

    def _prune(self, ctx: DriverContext) -> None:
        """Forget done files that are gone from their directory."""
        done = ctx.buffer.conn.execute("SELECT path FROM files WHERE state = 'done'").fetchall()
        gone = [(p,) for (p,) in done if not os.path.exists(p)]
        if gone:
            ctx.buffer.write(lambda c: c.executemany("DELETE FROM files WHERE path = ?", gone))


def _create_table(c: sqlite3.Connection) -> None:
    """The `files` table, with `digest` added to a table of version 1."""
    c.execute(FILES_SCHEMA)
    columns = {row[1] for row in c.execute("PRAGMA table_info(files)")}
    if "digest" not in columns:
        c.execute("ALTER TABLE files ADD COLUMN digest TEXT")


def _sha256(fh: BinaryIO, size: int) -> str:
    """SHA-256 of the first `size` bytes of an open file."""
    digest = hashlib.sha256()
    left = size
    while left > 0:
        chunk = fh.read(min(_HASH_CHUNK, left))
        if not chunk:
            break
        digest.update(chunk)
        left -= len(chunk)
    return digest.hexdigest()


def _unchanged_stat(path: Path, st: os.stat_result) -> bool:
    try:
        now = path.stat()
    except FileNotFoundError:
        return False
    return (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def _restat(record: FileRecord, st: os.stat_result) -> FileRecord:
    return FileRecord(
        record.path,
        st.st_size,
        st.st_mtime_ns,
        st.st_ino,
        record.state,
        record.rows_done,
        record.events,
        record.digest,
    )


def _lookup(ctx: DriverContext, path: Path) -> FileRecord | None:
    row = ctx.buffer.conn.execute(
        "SELECT path, size, mtime_ns, inode, state, rows_done, events, digest FROM files"
        " WHERE path = ?",
        (str(path),),
    ).fetchone()
    return FileRecord(*row) if row else None


def _save(c: sqlite3.Connection, record: FileRecord) -> None:
    c.execute(
        "INSERT OR REPLACE INTO files (path, version, size, mtime_ns, inode, state, rows_done,"
        " events, updated_ns, digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            record.path,
            FILE_STATE_VERSION,
            record.size,
            record.mtime_ns,
            record.inode,
            record.state,
            record.rows_done,
            record.events,
            time.time_ns(),
            record.digest,
        ),
    )


def _forget(ctx: DriverContext, path: Path) -> None:
    ctx.buffer.write(lambda c: c.execute("DELETE FROM files WHERE path = ?", (str(path),)))


def _free_name(target: Path) -> Path:
    if not target.exists():
        return target
    return target.with_name(f"{target.name}.{time.time_ns()}")


def _move(path: Path, directory: Path, target: Path | None = None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    target = target or _free_name(directory / path.name)
    try:
        os.rename(path, target)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        shutil.move(path, target)  # another filesystem
