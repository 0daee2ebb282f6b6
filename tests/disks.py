"""Real small disks for tests that fill one up or turn it read-only: a tmpfs of a given size
mounted under the test's directory (root only), unmounted afterwards."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


class SmallDisk:
    """A tmpfs mounted at `path`, to fill up, free or turn read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / "ballast"

    def fill(self, leave: int = 0) -> None:
        """Take all of its free space but about `leave` bytes (rounded down to whole pages).
        A program writing to the disk meanwhile may take some between the look at what is
        free and the ballast's write, which then fills the disk: the ballast gives `leave`
        bytes back."""
        stats = os.statvfs(self.path)
        free = stats.f_bavail * stats.f_frsize
        try:
            with self.ballast.open("ab") as ballast:
                ballast.write(b"\0" * max(0, free - leave))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            with self.ballast.open("r+b") as ballast:
                ballast.truncate(max(0, ballast.seek(0, 2) - leave))

    def take(self, size: int) -> None:
        """Take `size` bytes of its space."""
        with self.ballast.open("ab") as ballast:
            ballast.write(b"\0" * size)

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[SmallDisk | None]:
    """A tmpfs of `size` (`mount -o size=`: "1m", "8m") mounted at `path` (created), unmounted
    on leaving; None, with nothing mounted, where mounting is not possible (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        yield None
        return
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]
    if subprocess.run(command, capture_output=True, check=False).returncode != 0:
        yield None
        return
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
