"""Making a race between threads (or processes) of the embedded store certain: hold one at a
call until the other has done its part (`Held`), run work on a thread (`Run`), and see who
waits for a segment's `flock` (`waiting_on`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

WAIT_S = 30


class Held:
    """`owner.<name>` (a function of `os` by default, or a method of a class) patched so that
    its first call from a thread other than the main one waits, its arguments (a descriptor)
    already evaluated and its caller holding whatever it holds, until `release()`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, owner: object = os) -> None:
        self.arrived, self._go = threading.Event(), threading.Event()
        real: Callable = getattr(owner, name)
        main = threading.main_thread()

        def held(*args, **kwargs):
            if threading.current_thread() is not main and not self.arrived.is_set():
                self.arrived.set()
                assert self._go.wait(WAIT_S)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, held)

    def wait(self) -> None:
        assert self.arrived.wait(WAIT_S), "the other thread never reached the held call"

    def release(self) -> None:
        self._go.set()


class Run(threading.Thread):
    """`work()` on a thread; `outcome()` is what it returned or raised."""

    def __init__(self, work: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    def outcome(self) -> tuple[object, BaseException | None]:
        self.join(WAIT_S)
        assert not self.is_alive()
        return self.result, self.error


def waiting_on(path: Path) -> bool:
    """Whether some process or thread waits for an `flock` on `path` (`/proc/locks`)."""
    inode = os.stat(path).st_ino
    locks = Path("/proc/locks").read_text()
    return any(
        "->" in line and line.split()[-3].endswith(f":{inode}") for line in locks.splitlines()
    )
