"""Outputs that cannot be written: refused before a job starts, and named when a write fails.

Every command that writes files (the export, the streaming join, a replay, `sluice join`, a
job's checkpoint) checks where it will write with `check_writable` before its work starts
(before Spark, before anything is registered): a regular file in the way, a read-only
filesystem, no permission or no space left is one line, `OutputNotWritable`, that names the
path and says what to do. A disk that fills (or turns read-only) while a job writes is the
same error, made by `refused_writes` around the writes, and says what running again does (the
job's own delivery guarantee, given by the caller). Standard library only.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.errors import SluiceError

#: errno -> what it says about the output itself, and about a directory on its way (`{at}`);
#: any other error is not about where the output goes
_REFUSED = {
    errno.ENOSPC: ("no space left on its filesystem", "no space left on the filesystem of {at}"),
    errno.EDQUOT: ("its disk quota is used up", "the disk quota of {at} is used up"),
    errno.EROFS: ("its filesystem is read-only", "{at} is on a read-only filesystem"),
    errno.EACCES: ("not writable (permission denied)", "{at} is not writable (permission denied)"),
    errno.EPERM: ("not writable (not permitted)", "{at} is not writable (not permitted)"),
    errno.ENOTDIR: ("a regular file is in its way", "a regular file is in the way under {at}"),
}
_FULL = (errno.ENOSPC, errno.EDQUOT)
FREE_SPACE = "free space on its filesystem and run again"


class OutputNotWritable(SluiceError):
    """Where a command writes cannot be written: `what` (`output directory`, `checkpoint
    directory`, `output file`) at `path`, the `problem`, and the `hint` of what to do."""

    def __init__(self, what: str, path: str, problem: str, hint: str) -> None:
        self.what, self.path, self.problem, self.hint = what, path, problem, hint
        msg = f"{what} {path}: {problem}; {hint}"
        super().__init__(msg)


def check_writable(path: Path, what: str = "output directory", *, file: bool = False) -> None:
    """Refuse `path` (a directory to create or fill; with `file`, a file to create or
    replace) when it cannot be written: a directory on its way is a regular file, or the
    nearest existing one takes no new file (read-only, no permission, no space left).
    Nothing is left behind: a hidden probe file is written there and removed."""
    path = Path(path).absolute()
    existing = path.parent if file else path
    while not os.path.lexists(existing):
        existing = existing.parent
    if not existing.is_dir():
        where = "it" if existing == path else str(existing)
        kind = "a regular file" if existing.exists() else "a broken symbolic link"
        hint = f"choose another {what}, or move that file away"
        raise OutputNotWritable(what, str(path), f"{where} is {kind}, not a directory", hint)
    try:
        _probe(existing)
    except FileNotFoundError:  # an existing directory that takes no files (/proc, /sys)
        problem = f"{existing} takes no new files (a virtual filesystem such as /proc?)"
        raise OutputNotWritable(what, str(path), problem, _not_writable_hint(what)) from None
    except OSError as exc:
        refused = _REFUSED.get(exc.errno or 0)
        if refused is None:
            raise
        problem = refused[0] if existing == path else refused[1].format(at=existing)
        hint = FREE_SPACE if exc.errno in _FULL else _not_writable_hint(what)
        raise OutputNotWritable(what, str(path), problem, hint) from None


def _not_writable_hint(what: str) -> str:
    return f"choose another {what}, or make it writable"


def _probe(directory: Path) -> None:
    """Create a hidden file in `directory`, write a byte to it and remove it: a read-only
    filesystem refuses the file, a full one the byte."""
    probe = directory / f".sluice-probe-{os.getpid()}-{secrets.token_hex(4)}.tmp"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"\0")
    finally:
        os.close(fd)
        probe.unlink()


def refusal(
    path: Path, exc: OSError, rerun: str, what: str = "output directory"
) -> OutputNotWritable | None:
    """`OutputNotWritable` naming `path` when `exc` says its disk refused a write (full,
    read-only, no permission, a file in the way), else None; `rerun` says what running again
    does once the disk takes writes (the job's delivery guarantee)."""
    refused = _REFUSED.get(exc.errno or 0)
    if refused is None:
        return None
    if exc.errno in _FULL:
        hint = f"{FREE_SPACE}: {rerun}"
    else:
        hint = f"{_not_writable_hint(what)}, then run again: {rerun}"
    return OutputNotWritable(what, str(path), refused[0], hint)


@contextmanager
def refused_writes(path: Path, rerun: str, what: str = "output directory") -> Iterator[None]:
    """Raise an `OSError` from inside that says the disk refused a write as
    `OutputNotWritable` naming `path` (`refusal`); any other error passes as it is."""
    try:
        yield
    except OSError as exc:
        refused = refusal(path, exc, rerun, what)
        if refused is None:
            raise
        raise refused from None
