"""A job's checkpoint directory: held by one run at a time, and read for its progress.

    <checkpoint>/job.json       which job it belongs to (`JobIdentity`, versioned)
                 parameters.json  what its output was made with beyond that (`JobParameters`)
                 start_cut      the cut its first batch started from (`--from` resolved);
                 start_cut.N    with several sources (a join), the cut of source N
                 run.lock       `flock`ed by the one run using it; holds that run's pid
                 spark/         Spark's checkpoint: offsets (stream cuts) and commits
                 ledger.sqlite  the sink's batch ledger (`pipeline/spark/ledger.py`)
                 schema.avsc    an export's: the schema its last run used (`export.py`)
                 stop/          a running query's stop request (`stopping.py`)

A run on a checkpoint in use (`CheckpointInUse`), of another job (`CheckpointMismatch`) or,
once it has output, with other parameters (`ParametersChanged`) is refused; `--from` counts on
a new checkpoint only, and a run that gives another one is told so (`note_start`). Progress
is read without the lock, so a sensor can follow a running service; whether anything is in
doubt (`settled_position`) is read by the run holding it, before Spark starts.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import IO

from pipeline import durable
from pipeline.config import canonical_store, is_store_uri, sluice_home
from pipeline.errors import SluiceError
from pipeline.outputs import check_writable
from pipeline.spark.ledger import BatchLedger
from pipeline.streams import StreamCut

IDENTITY_VERSION = 1
PARAMETERS_VERSION = 1
OFFSET_LOG_VERSION = "v1"

log = logging.getLogger(__name__)


class CheckpointError(SluiceError):
    """Base of the errors about a job's checkpoint directory."""


class CheckpointInUse(CheckpointError):
    def __init__(self, path: Path, holder: str) -> None:
        self.path, self.holder = path, holder
        msg = (
            f"checkpoint {path} is in use by another run ({holder}): wait for it to finish, "
            "stop it, or give this run its own --checkpoint"
        )
        super().__init__(msg)


class CheckpointMismatch(CheckpointError):
    def __init__(self, path: Path, recorded: str, wanted: str) -> None:
        self.path, self.recorded, self.wanted = path, recorded, wanted
        msg = (
            f"checkpoint {path} belongs to `{recorded}`, not `{wanted}`: "
            "give this job its own --checkpoint (or delete that directory to start over)"
        )
        super().__init__(msg)


class ParametersChanged(CheckpointError):
    """A run on a checkpoint with output made with other parameters: going on would mix the
    two under one checkpoint (slices of two conditions, files of another format only from
    here on) without a word. `recorded` and `wanted` are the two sets of flags; `why` says
    what a change would mix, `remedy` how to go on with the new ones."""

    def __init__(
        self,
        path: Path,
        job: str,
        recorded: tuple[str, ...],
        wanted: tuple[str, ...],
        *,
        why: str,
        remedy: str,
    ) -> None:
        self.path, self.job, self.recorded, self.wanted = path, job, recorded, wanted
        gone = ", ".join(f for f in recorded if f not in wanted)
        new = ", ".join(f for f in wanted if f not in recorded)
        if gone and new:
            change = f"with {gone}, not {new}"
        else:
            change = f"without {new}" if new else f"with {gone}, which this run lacks"
        again = " ".join(recorded) or "none of them"
        msg = (
            f"{job} checkpoint {path} was made {change}: {why}. Run again with {again}, or {remedy}"
        )
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class JobParameters:
    """What a checkpoint's output was made with beyond its identity: the flags (as the
    command line gives them, e.g. `--format csv,parquet`) whose change would mix two kinds of
    output under one checkpoint, in any order. Saved as `<checkpoint>/parameters.json`."""

    job: str
    flags: tuple[str, ...]
    version: int = PARAMETERS_VERSION

    @classmethod
    def read(cls, root: Path) -> JobParameters | None:
        path = root / "parameters.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise UnreadableCheckpoint(root, f"{path}: {exc}") from None
        if not isinstance(data, dict) or data.get("version") != PARAMETERS_VERSION:
            reason = f"{path} is not version {PARAMETERS_VERSION}"
            raise UnreadableCheckpoint(root, reason)
        return cls(str(data["job"]), tuple(data["flags"]))


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """What a checkpoint's positions mean: the job, where it reads and where it writes."""

    job: str
    source: str
    target: str
    version: int = IDENTITY_VERSION

    def describe(self) -> str:
        return f"{self.job} {self.source} -> {self.target}"

    def canonical(self) -> JobIdentity:
        """This identity with its stores and paths spelled one way (`canonical_store`; paths
        resolved): `embedded:` and the default store's directory, a link or `..` name one
        store, so one job, and one checkpoint (two would copy or export everything twice)."""
        return replace(self, source=_canonical(self.source), target=_canonical(self.target))


def _canonical(end: str) -> str:
    """One end of an identity: `STORE#WHAT` with its store canonical, an absolute path
    resolved, anything else as it is. (A `#` in an embedded store's directory splits it
    early, alike for every identity compared.)"""
    store, sep, what = end.partition("#")
    if sep and is_store_uri(store):
        return f"{canonical_store(store)}#{what}"
    return str(Path(end).resolve()) if end.startswith("/") else end


def default_checkpoint(identity: JobIdentity, source: str, target: str) -> Path:
    """`$SLUICE_HOME/checkpoints/<job>/<source>--<target>-<hash>`: `source` and `target` are
    the job's readable names (its streams, its output, without their stores) made path-safe
    (readable, not unique: `/d/out a` and `/d/out.a` read alike, a long name keeps its tail),
    and the hash is 16 hex digits of a hash of the whole `identity` (`canonical`), stores
    included, so two jobs never share one (the same streams mirrored into two stores,
    exported from two), and one job spelled two ways has one.

    A default checkpoint named the former ways is still found, so that a run goes on where it
    stopped rather than start over (`_named_otherwise`). Each job names its own in one
    place (`mirror_checkpoint`, `export_checkpoint`, …): the assets use those too."""
    folder = sluice_home() / "checkpoints" / identity.job
    slug = f"{_safe(source, 100)}--{_safe(target, 100)}"
    wanted = identity.canonical()
    hashed = folder / f"{slug}-{_hash(asdict(wanted))}"
    if hashed.exists():
        return hashed
    names_hashed = folder / f"{slug}-{_hash([identity.job, source, target])}"
    if names_hashed.exists() and _recorded_identity(names_hashed) is None:
        return names_hashed  # see `_named_otherwise`
    return _named_otherwise(folder, wanted) or hashed


def _named_otherwise(folder: Path, wanted: JobIdentity) -> Path | None:
    """The default checkpoint of the job `wanted` made under another name, if any: the first,
    by name, whose `job.json` records that job. Its stores or output spelled another way
    (`..`, a link, `embedded:` for the default store), or a former version's name:

    - `<source>--<target>` with no hash (shared by names that read alike, so only its
      `job.json` says whose it is);
    - `<slug>-<hash of the job and the names alone>` (shared by the same names in other
      stores). One of those whose `job.json` is missing or unreadable is taken too
      (`default_checkpoint`): its run reports what is wrong with it, where a new checkpoint
      beside it would start over (a mirror would copy everything again);
    - `<slug>-<hash of the identity as written>`."""
    try:
        roots = sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return None
    for root in roots:
        recorded = _recorded_identity(root)
        if recorded is not None and recorded.canonical() == wanted:
            return root
    return None


def _hash(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _recorded_identity(root: Path) -> JobIdentity | None:
    """The identity `root/job.json` records; None when it is missing or cannot be read."""
    try:
        return JobIdentity(**json.loads((root / "job.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _safe(text: str, keep: int = 120) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", ".", text.strip("/")).strip(".")
    return cleaned[-keep:] or "default"


class Checkpoint:
    """An acquired checkpoint directory; use as a context manager (it releases the lock).

    One checkpoint per job and output: silently continuing another job's positions would
    skip or repeat data. The lock is an `flock`, released by the kernel when the holding
    process dies, so a run killed with SIGKILL never leaves a stale lock behind."""

    def __init__(self, root: Path, identity: JobIdentity) -> None:
        self.root = root.absolute()
        self.identity = identity
        self._lock: IO[str] | None = None

    @property
    def spark_dir(self) -> Path:
        return self.root / "spark"

    @property
    def ledger_path(self) -> Path:
        return self.root / "ledger.sqlite"

    @property
    def stop_dir(self) -> Path:
        return self.root / "stop"

    @property
    def start_cut(self) -> str | None:
        """The cut the first batch of a checkpoint of one source started from, once recorded."""
        return recorded_start(self.root)

    def start_of(self, source: int, sources: int) -> str | None:
        """Where source `source` (of `sources`) started, once recorded."""
        return _read_cut(self.root / _start_file(source, sources))

    def record_start(self, cut: str, source: int = 0, sources: int = 1) -> None:
        """Remember where a source of a new checkpoint starts, before its first batch is
        planned."""
        durable.write_text(self.root / _start_file(source, sources), cut + "\n")

    @property
    def is_new(self) -> bool:
        """True before the first batch was planned: Spark's offset log holds no batch (the
        temporary file of a write of batch 0 cut short is not one)."""
        return not _batch_ids(self.spark_dir / "offsets")

    def _clear_cut_short_first_batch(self) -> None:
        """Remove what a run killed while Spark wrote its first offset (or commit) entry left
        behind: the write's temporary file (`.0.<uuid>.tmp`, and its `.crc` on a local
        disk). Spark takes a checkpoint whose offset log holds no batch for a new query,
        and refuses to start a new query where the offset or commit log holds any file at
        all (`spark.sql.streaming.verifyCheckpointDirectoryEmptyOnStart`, on since Spark
        4.1): every later run of the job failed. Nothing was planned, so nothing is lost;
        only hidden files go, and only while the lock is held."""
        if not self.is_new:
            return
        commits = self.spark_dir / "commits"  # (with batches of its own, it is Spark's to read)
        logs = [self.spark_dir / "offsets", *([] if _batch_ids(commits) else [commits])]
        cut_short = [
            entry
            for folder in logs
            if folder.is_dir()
            for entry in folder.iterdir()
            if entry.name.startswith(".") and entry.is_file()
        ]
        for entry in cut_short:
            log.info(
                "%s: removing %s, left by a run stopped while Spark wrote it",
                self.identity.job,
                entry,
            )
            entry.unlink(missing_ok=True)

    def __enter__(self) -> Checkpoint:
        check_writable(self.root, "checkpoint directory")  # a file in the way, a full disk
        self.root.mkdir(parents=True, exist_ok=True)
        self._acquire()
        try:
            self._check_identity()
            self._clear_cut_short_first_batch()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _acquire(self) -> None:
        handle = (self.root / "run.lock").open("a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "pid unknown"
            handle.close()
            raise CheckpointInUse(self.root, holder) from None
        handle.seek(0)
        handle.truncate()
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        handle.write(f"pid {os.getpid()}, started {started}")
        handle.flush()
        self._lock = handle

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def check_parameters(
        self, wanted: JobParameters, *, has_output: bool, why: str, remedy: str
    ) -> None:
        """Refuse (`ParametersChanged`, saying `why` a change matters and the `remedy`) to go
        on with other parameters than those the checkpoint's output was made with; else
        record `wanted`.

        `has_output`: whether anything made with the recorded ones may be out or be published
        by a re-run (a planned batch, a saved state). Before that, new parameters replace
        the recorded ones: a first run that failed can be run again otherwise. A checkpoint
        from before parameters were recorded takes this run's."""
        recorded = JobParameters.read(self.root)
        if recorded is not None and has_output and set(recorded.flags) != set(wanted.flags):
            flags = (recorded.flags, wanted.flags)
            raise ParametersChanged(self.root, wanted.job, *flags, why=why, remedy=remedy)
        if recorded != wanted:
            durable.write_json(self.root / "parameters.json", asdict(wanted))

    def note_start(self, starting: str) -> None:
        """Say (a warning) that a `--from` other than the default is not where this run starts:
        a checkpoint that has begun goes on from where it stopped."""
        recorded = self.start_cut
        if starting.lower() == "head" or self.is_new or starting == recorded:
            return
        began = f" (it began at {recorded})" if recorded else ""
        log.warning(
            "%s: --from %s ignored: checkpoint %s goes on from where it stopped%s; --from "
            "counts for a new checkpoint only (give a new --checkpoint to start there)",
            self.identity.job,
            starting,
            self.root,
            began,
        )

    def _check_identity(self) -> None:
        path = self.root / "job.json"
        if path.exists():
            recorded = JobIdentity(**json.loads(path.read_text()))
            if recorded.canonical() != self.identity.canonical():
                raise CheckpointMismatch(self.root, recorded.describe(), self.identity.describe())
            return
        durable.write_json(path, asdict(self.identity))


def recorded_start(root: Path) -> str | None:
    """The start cut recorded in the checkpoint of one source at `root` (None for one made
    before it was)."""
    return _read_cut(root / _start_file(0, 1))


def _start_file(source: int, sources: int) -> str:
    return "start_cut" if sources == 1 else f"start_cut.{source}"


def _read_cut(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


# --- progress: read without the lock, by sensors and catch-up runs ------------------------


class UnreadableCheckpoint(CheckpointError):
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
    """The checkpoint's last committed batch (the highest name under `spark/commits/`), or
    None before its first one. Spark writes a commit file only after the batch's sink commit
    returned, so a committed batch is published and its end cut is durable."""
    commits = _batch_ids(root / "spark" / "commits")
    if not commits:
        return None
    batch_id = commits[-1]
    return CheckpointProgress(root, batch_id, batch_end_cut(root, batch_id))


def batch_end_cut(root: Path, batch_id: int) -> StreamCut:
    """The end cut of `batch_id`: the last line of `spark/offsets/<batch>`, the `sluice`
    source's offset JSON `{"cut": "v1~…"}` (Spark's offset log, format `v1`)."""
    return batch_end_cuts(root, batch_id)[-1]


def batch_end_cuts(root: Path, batch_id: int) -> tuple[StreamCut, ...]:
    """The end cut of every source of `batch_id`, in the offset log's order: after the
    version and the batch's metadata, one line per source (the streaming join has two)."""
    path = root / "spark" / "offsets" / str(batch_id)
    try:
        lines = path.read_text().strip().splitlines()
    except OSError as exc:
        raise UnreadableCheckpoint(root, f"{path}: {exc.strerror}") from None
    if len(lines) < 3 or lines[0] != OFFSET_LOG_VERSION:
        raise UnreadableCheckpoint(root, f"{path} is not a {OFFSET_LOG_VERSION} offset log")
    try:
        return tuple(StreamCut.parse(json.loads(line)["cut"]) for line in lines[2:])
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableCheckpoint(
            root, f"{path}: no stream cut in its source offset ({exc})"
        ) from None


class InDoubt(CheckpointError):
    """A checkpoint whose last batch may not be finished: only Spark can settle it."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        msg = f"checkpoint {path}: {reason}"
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class SettledPosition:
    """A checkpoint with nothing in doubt: its last batch and the end cut of each source."""

    batch_id: int
    end_cuts: tuple[StreamCut, ...]


def settled_position(root: Path) -> SettledPosition:
    """Where the checkpoint at `root` stands when every batch it planned is finished, else
    `InDoubt` with the reason. Read it holding the checkpoint (nothing moves meanwhile).

    Finished means: Spark committed the last batch it planned (`spark/commits/N` beside the
    highest `spark/offsets/N`: a planned batch without its commit is re-run by Spark on the
    next start), and the sink's ledger, if any, holds no batch after N and none that is not
    done (an intent is a publish that may be half done; only the sink's commit finishes it).
    Spark re-runs nothing for a settled checkpoint: from here it only plans new batches."""
    planned = _batch_ids(root / "spark" / "offsets")
    committed = _batch_ids(root / "spark" / "commits")
    if not planned or not committed:
        raise InDoubt(root, "no batch committed yet")
    last = committed[-1]
    if planned[-1] != last:
        reason = f"Spark planned up to batch {planned[-1]} and committed up to batch {last}"
        raise InDoubt(root, reason)
    if unfinished := _unfinished(root, last):
        batch_id, state = unfinished[0]
        reason = f"the ledger holds batch {batch_id} as {state}; Spark committed up to {last}"
        raise InDoubt(root, reason)
    return SettledPosition(last, batch_end_cuts(root, last))


@dataclass(frozen=True, slots=True)
class PlannedBatch:
    """The batch planned right after a checkpoint's last committed one, not committed yet:
    its id, where it starts (the last batch's end cuts) and where it ends."""

    batch_id: int
    start_cuts: tuple[StreamCut, ...]
    end_cuts: tuple[StreamCut, ...]


def planned_batch(root: Path) -> PlannedBatch | None:
    """The batch in doubt when it is the only thing in doubt: Spark's offset log holds one
    batch past the last commit, and the ledger, if any, nothing but that batch past it (in
    any state). A re-run over its cuts then finishes it exactly as Spark's restart would:
    the ledger's record of it, if any, is what gets published. None for anything else."""
    planned = _batch_ids(root / "spark" / "offsets")
    committed = _batch_ids(root / "spark" / "commits")
    if not planned or not committed or planned[-1] != committed[-1] + 1:
        return None
    last = committed[-1]
    if any(batch_id != last + 1 for batch_id, _ in _unfinished(root, last)):
        return None
    return PlannedBatch(last + 1, batch_end_cuts(root, last), batch_end_cuts(root, last + 1))


def _unfinished(root: Path, last: int) -> list[tuple[int, str]]:
    path = root / "ledger.sqlite"
    if not path.exists():
        return []  # a foreachBatch job: its state is saved before Spark commits the batch
    try:
        with BatchLedger(path) as ledger:
            return list(ledger.unfinished(after=last))
    except sqlite3.Error as exc:
        raise UnreadableCheckpoint(root, f"{path}: {exc}") from None


def ledger_totals(root: Path, after: int = -1, upto: int | None = None) -> BatchTotals:
    """Counts of the batches in (after, upto] that the ledger marked done (all by default)."""
    path = root / "ledger.sqlite"
    if not path.exists():
        return BatchTotals()
    with BatchLedger(path) as ledger:
        records = [r for r in ledger.batches(since=after) if upto is None or r.batch_id <= upto]
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
