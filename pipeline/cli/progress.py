"""Progress of long work, on standard error only and shown the way each place expects it.

    with Progress.of(args).task("verify") as task:
        store.verify(stream, task.count)

On a terminal (standard error a TTY) a task is a tqdm bar, redrawn in place, whose clock runs
while a stage is under way. Anywhere else (a pipe, a log file, systemd's journal) it is plain
lines: each stage as it starts, one line each tenth of the way through counted work, and each
note (a batch's report). `-q` shows nothing; `-v` also writes, on a terminal, each stage and
note as a line above the bar, and on plain lines the seconds since the task began. Standard
output, which scripts parse, is never written to. A command whose own data goes to a terminal
on standard output (`sluice store read`, `sluice run console`) would tear a bar apart, so it
gets plain lines there.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal, Protocol

from pipeline.wording import counted

Style = Literal["bar", "lines", "off"]
#: A bar is redrawn this often while nothing is counted, so that its clock keeps running.
TICK_S = 0.5


class Task(Protocol):
    """One piece of long work as a command shows it."""

    def stage(self, text: str) -> None:
        """The work has moved on to `text` (`starting Spark`)."""

    def status(self, text: str) -> None:
        """What the bar says now (`1,200 events so far`), no stage: plain lines skip it."""

    def count(self, done: int, total: int | None = None) -> None:
        """`done` units of `total` (a store's `Progress` callback: bytes checked of all)."""

    def note(self, text: str) -> None:
        """A line worth keeping: always on plain lines, above the bar only with `-v`."""


@dataclass(frozen=True, slots=True)
class Progress:
    """How this run of a command shows progress: a bar, plain lines, or nothing."""

    style: Style
    verbose: bool = False

    @classmethod
    def of(cls, args: argparse.Namespace, *, data_on_stdout: bool = False) -> Progress:
        """The style the global `-q`/`-v` and the terminals ask for."""
        if getattr(args, "quiet", False):
            return cls("off")
        terminal = sys.stderr.isatty() and not (data_on_stdout and sys.stdout.isatty())
        return cls("bar" if terminal else "lines", bool(getattr(args, "verbose", 0)))

    @contextmanager
    def task(self, what: str, unit: str = "byte") -> Iterator[Task]:
        """A task named `what` (the line's prefix) counting `unit`s; closed on leaving."""
        shown: BarTask | LineTask | SilentTask
        if self.style == "bar":
            shown = BarTask(what, unit, self.verbose)
        elif self.style == "lines":
            shown = LineTask(what, unit, self.verbose)
        else:
            shown = SilentTask()
        try:
            yield shown
        finally:
            shown.close()


class SilentTask:
    """`-q`: nothing at all."""

    def stage(self, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass

    def count(self, done: int, total: int | None = None) -> None:
        pass

    def note(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class LineTask:
    """Plain lines on standard error: stages, notes, and counted work by tenths."""

    def __init__(self, what: str, unit: str, verbose: bool) -> None:
        self.what, self.unit, self.verbose = what, unit, verbose
        self.started, self.tenth = time.monotonic(), -1

    def _line(self, text: str) -> None:
        if self.verbose:
            text += f" [{time.monotonic() - self.started:.1f} s]"
        print(text, file=sys.stderr, flush=True)

    def stage(self, text: str) -> None:
        self._line(f"{self.what}: {text}")

    def status(self, text: str) -> None:
        pass

    def count(self, done: int, total: int | None = None) -> None:
        if total is None:
            return
        tenth = 10 * done // total if total > 0 else 10
        if tenth > self.tenth:
            self.tenth = tenth
            percent = 100 * done // total if total > 0 else 100
            self._line(f"{self.what}: {done:,} of {counted(total, self.unit)} ({percent}%)")

    def note(self, text: str) -> None:
        self._line(text)

    def close(self) -> None:
        pass


class BarTask:
    """A tqdm bar on standard error: a percentage bar once a total is known, else the stage
    and a running clock."""

    STAGE_FORMAT = "{desc} [{elapsed}]"

    def __init__(self, what: str, unit: str, verbose: bool) -> None:
        from tqdm import tqdm

        self.what, self.verbose = what, verbose
        in_bytes = unit == "byte"
        self.bar = tqdm(
            desc=what,
            file=sys.stderr,
            unit="B" if in_bytes else f" {unit}s",
            unit_scale=in_bytes,
            unit_divisor=1024 if in_bytes else 1000,
            dynamic_ncols=True,
            bar_format=self.STAGE_FORMAT,
        )
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, name=f"progress {what}", daemon=True)
        self.ticker.start()

    def _tick(self) -> None:
        while not self.stopped.wait(TICK_S):
            self.bar.refresh()

    def stage(self, text: str) -> None:
        self.bar.set_description_str(f"{self.what}: {text}")
        if self.verbose:
            self.bar.write(f"{self.what}: {text}", file=sys.stderr)

    def status(self, text: str) -> None:
        self.bar.set_description_str(f"{self.what}: {text}")

    def count(self, done: int, total: int | None = None) -> None:
        if total is not None and total != self.bar.total:
            self.bar.total = total
            self.bar.bar_format = None  # tqdm's own: percentage, bar, rate, time left
        self.bar.update(done - self.bar.n)

    def note(self, text: str) -> None:
        if self.verbose:
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.stopped.set()
        self.ticker.join()
        self.bar.close()
