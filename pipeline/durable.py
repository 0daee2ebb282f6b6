"""Durable, atomic file writes: the one way Sluice replaces a file.

A reader sees either the old file or the whole new one, never a part, and once a write
returns it survives a power cut: the data goes to a hidden temporary name beside the target,
is fsynced, renamed over the target, and the directory is fsynced so the rename itself is
durable. Standard library only: the stream store and the edge collectors use it too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (which makes the names created in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """fsync a directory: the entries created, renamed or removed in it become durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> None:
    """`path` and whichever of its parents are missing, each new directory's name made
    durable (its parent fsynced): a file published into them survives a power cut with the
    directories that lead to it. Safe against another process creating them at once."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        fsync_dir(directory.parent)


#: `staging_name`'s pattern: `.<name>.<pid>-<8 hex>.tmp`.
_STAGING = re.compile(r"\..+\.(?P<pid>[0-9]+)-[0-9a-f]{8}\.tmp")


def remove_abandoned(directory: Path) -> list[Path]:
    """Remove the staging files (and directories) in `directory` whose writer process is
    gone: what a writer killed before its rename left (`atomic_path`). A staging name whose
    process still runs, or may (another user's, a pid now reused), is left alone. Only for
    a directory whose writers run on this machine. Returns what was removed."""
    removed = []
    for entry in sorted(directory.iterdir()) if directory.is_dir() else []:
        found = _STAGING.fullmatch(entry.name)
        if found is None or _running(int(found["pid"])):
            continue
        with contextlib.suppress(FileNotFoundError):
            _remove(entry)
            removed.append(entry)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def staging_name(path: Path) -> Path:
    """A hidden temporary name for a new version of `path`, unique to this writer (so two
    processes replacing one file at once never rename each other's staging file away). It
    ends in `.tmp`, so no glob for the final files' extension (`*.parquet`) ever matches it."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path to write `path`'s new content to, by any library: a file, or a
    directory of files. On a clean exit it is fsynced and renamed over `path` (a directory
    only onto a name that does not exist yet); on an error it is removed and `path` is left
    as it was (a crash may leave a hidden `.tmp` beside it, which nothing reads); parents are
    created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_name(path)
    try:
        yield staging
        if staging.is_dir():
            for child in staging.iterdir():
                fsync_path(child)
        fsync_path(staging)
        os.replace(staging, path)
    except BaseException:
        _remove(staging)
        raise
    fsync_dir(path.parent)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_bytes(path: Path | str, data: bytes) -> Path:
    """Replace `path` with `data`, atomically and durably."""
    path = Path(path)
    with atomic_path(path) as staging:
        staging.write_bytes(data)
    return path


def write_text(path: Path | str, text: str) -> Path:
    """Replace `path` with `text` (UTF-8), atomically and durably."""
    return write_bytes(path, text.encode())


def write_json(path: Path | str, data: Any, **dumps: Any) -> Path:
    """Replace `path` with `data` as JSON (indented, one trailing newline), atomically and
    durably. Keyword arguments go to `json.dumps` (e.g. `sort_keys=True`, `default=str`)."""
    dumps.setdefault("indent", 2)
    return write_text(path, json.dumps(data, **dumps) + "\n")
