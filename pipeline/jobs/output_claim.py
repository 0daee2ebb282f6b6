"""One output directory, one checkpoint: the claim a job keeps in the directory it writes.

The export and the streaming join name their files by batch (`part-b<batch>-t<task>-f<n>`,
`part-<batch>.parquet`), so two checkpoints writing one directory publish the same names, and
rows are replaced or counted twice. Files already there tell a new checkpoint that the
directory is taken (`OutputTaken`, `JoinOutputTaken`); before any file is, the claim does:
`.sluice-claim` in the directory names the checkpoint that writes it, made before the first
batch, under a lock on the directory (two runs starting at once: one claims it, the other is
refused). A claim whose checkpoint is gone (deleted, or moved with its home) passes to the
next checkpoint; the files it left are judged as before.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline import durable
from pipeline.errors import SluiceError

CLAIM_FILE = ".sluice-claim"


class OutputClaimed(SluiceError, ValueError):
    """The output directory is claimed by another checkpoint, which still exists."""

    def __init__(self, job: str, output: Path, checkpoint: Path, holder: str) -> None:
        self.job, self.output, self.checkpoint, self.holder = job, output, checkpoint, holder
        msg = (
            f"{job} output {output} is written by the checkpoint {holder} (its claim: "
            f"{Path(output) / CLAIM_FILE}), and this run's checkpoint {checkpoint} is another: "
            "both would write files of the same names, and rows would be replaced or counted "
            f"twice. Go on with that {job} (its --checkpoint), write into a new --output, or "
            "delete that checkpoint to free the directory"
        )
        super().__init__(msg)


def claim(job: str, output: Path, checkpoint: Path) -> None:
    """Make `checkpoint` the one that writes `output` (created if missing), unless another
    checkpoint that still exists has claimed it (`OutputClaimed`). The directory is reached
    by its real path, so a symbolic link to it or a path through `..` finds the same claim."""
    here = output.resolve()
    here.mkdir(parents=True, exist_ok=True)
    mine = str(checkpoint.resolve())
    with _locked(here):
        holder = read_claim(here)
        if holder == mine:
            return
        if holder is not None and Path(holder).exists():
            raise OutputClaimed(job, output, checkpoint, holder)
        durable.write_json(here / CLAIM_FILE, {"job": job, "checkpoint": mine})


def read_claim(output: Path) -> str | None:
    """The checkpoint that claimed `output`, or None (no claim, or one not readable: a claim
    is written whole, by rename, so only a hand-made file can be half of one)."""
    try:
        data = json.loads((output / CLAIM_FILE).read_text())
    except (OSError, ValueError):
        return None
    found = data.get("checkpoint") if isinstance(data, dict) else None
    return found if isinstance(found, str) else None


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on `directory` itself (no lock file to leave behind), held while a
    claim is read and written."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
