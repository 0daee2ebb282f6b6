"""A job's checkpoint directory: Spark's checkpoint, the batch ledger, the run lock.

    <checkpoint>/
      job.json        which job this checkpoint belongs to (JobIdentity, versioned)
      start_cut       the cut its first batch started from (`--from` resolved; Spark's own
                      logs name no start for batch 0)
      run.lock        held (flock) by the one run using the checkpoint; holds its pid
      spark/          Spark's own checkpoint (offsets = stream cuts, commits)
      ledger.sqlite   the sink's batch ledger (pipeline/spark/ledger.py)

One checkpoint per job and output. A second run on a checkpoint that is in use is refused
(`CheckpointInUse`), and so is a run of a different job or of other streams on it
(`CheckpointMismatch`): silently continuing another job's positions would skip or repeat data.
The lock is an `flock`, released by the kernel when the holding process dies — a run killed
with SIGKILL never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from pipeline import durable
from pipeline.config import sluice_home
from pipeline.errors import SluiceError

IDENTITY_VERSION = 1


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


@dataclass(frozen=True, slots=True)
class JobIdentity:
    """What a checkpoint's positions mean: the job, where it reads and where it writes."""

    job: str
    source: str
    target: str
    version: int = IDENTITY_VERSION

    def describe(self) -> str:
        return f"{self.job} {self.source} -> {self.target}"


def default_checkpoint(job: str, source_stream: str, target: str) -> Path:
    """`$SLUICE_HOME/checkpoints/<job>/<source>--<target>` with names made path-safe."""
    slug = f"{_safe(source_stream)}--{_safe(target)}"
    return sluice_home() / "checkpoints" / job / slug


def _safe(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", ".", text.strip("/")).strip(".")
    return cleaned[-120:] or "default"


class Checkpoint:
    """An acquired checkpoint directory; use as a context manager (it releases the lock)."""

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
    def start_cut(self) -> str | None:
        """The cut the checkpoint's first batch started from, once recorded."""
        return recorded_start(self.root)

    def record_start(self, cut: str) -> None:
        """Remember where a new checkpoint starts, before its first batch is planned."""
        durable.write_text(self.root / "start_cut", cut + "\n")

    @property
    def is_new(self) -> bool:
        """True before the first batch was planned (Spark has no offsets yet)."""
        offsets = self.spark_dir / "offsets"
        return not offsets.is_dir() or not any(offsets.iterdir())

    def __enter__(self) -> Checkpoint:
        self.root.mkdir(parents=True, exist_ok=True)
        self._acquire()
        try:
            self._check_identity()
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

    def _check_identity(self) -> None:
        path = self.root / "job.json"
        if path.exists():
            recorded = JobIdentity(**json.loads(path.read_text()))
            if recorded != self.identity:
                raise CheckpointMismatch(self.root, recorded.describe(), self.identity.describe())
            return
        durable.write_json(path, asdict(self.identity))


def recorded_start(root: Path) -> str | None:
    """The start cut recorded in the checkpoint at `root` (None for one made before it was)."""
    try:
        return (root / "start_cut").read_text().strip() or None
    except FileNotFoundError:
        return None
