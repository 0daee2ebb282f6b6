"""The root of Sluice's own errors: the `sluice` command prints any of them as one line.

Besides them, the two ways a command ends that are not errors, shared by the command line and
the jobs it runs (`pipeline/cli/process.py` turns them into an exit status): `Interrupted`
by a signal, and `OutputClosed` when standard output's reader went away.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any


class SluiceError(Exception):
    """An error with a message written for the user; no traceback needed.

    Errors survive pickling (Spark ships them between processes) with their fields and
    message, though their constructors take fields rather than the message: the default
    pickling would call `cls(message)`.
    """

    def __reduce__(self) -> tuple[Any, ...]:
        return _restore, (type(self), self.args, self.__dict__)


def _restore(cls: type[SluiceError], args: tuple[Any, ...], fields: dict[str, Any]) -> SluiceError:
    """An unpickled error: made without its constructor (as dlt's `DltException` is), given
    its message and fields back."""
    error = cls.__new__(cls, *args)
    error.args = args  # an OSError subclass leaves `args` to the __init__ not called here
    error.__dict__.update(fields)
    return error


class Interrupted(KeyboardInterrupt):
    """A signal that ends a command as Ctrl-C does (SIGINT, SIGTERM); `signum` says which,
    so the command ends with that signal's status (128 + `signum`)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.signum,)


class OutputClosed(BaseException):
    """Standard output's reader went away (EPIPE): the command stops, nothing to report.

    A BaseException, as KeyboardInterrupt is, so that no `except Exception` on the way (a
    batch that failed and is handed to Spark, a retry) takes it for a failure: it ends the
    command, and what was cut short stays undone (a batch stays planned, to be re-run).
    A `foreachBatch` function that prints must catch it (`pipeline/jobs/console.py`): py4j
    answers Spark's call only for an `Exception`, so Spark would wait for ever."""


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises `Interrupted` in this block, as Ctrl-C raises KeyboardInterrupt (main
    thread only; elsewhere nothing is installed)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    came: list[int] = []

    def interrupt(signum: int, frame: FrameType | None) -> None:
        came.append(signum)
        raise Interrupted(signum)

    earlier = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, earlier)
    if came:  # raised where Python could only print it (a weakref callback, a __del__)
        raise Interrupted(came[0])
