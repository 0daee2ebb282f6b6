"""How a `sluice` process meets the shell around it: its standard streams, signals and exit
status. `main` runs every command through `run_command`, so one rule holds for all of them:

- **An error Sluice raises on purpose** (`SluiceError`): one line, `sluice: error: …`, exit 1.
- **Standard output closed by its reader** (`sluice store read … | head -1`): the command
  stops at its next write, quietly, with exit status 141 (128 + SIGPIPE, what the shell
  shows for `cat` in the same place), so a `set -o pipefail` script sees that the output was
  cut short. What goes to standard output after that goes to /dev/null, so no flush at exit
  complains; an error that follows (where another thread wrote the output, as Spark's
  foreachBatch does) is taken for its consequence. Commands print after their work (a
  store's change is whole before its line is written), so a closed output never leaves a
  change half-done. `OutputClosed` is no `Exception` (`pipeline/errors.py`): nothing on its
  way takes it for a failure to retry; `sluice run console` stops its query after the batch
  it cut short, and leaves that batch to be printed again (`pipeline/jobs/console.py`).
- **Standard output that fails otherwise** (`> /dev/full`, `>&-`): one line,
  `sluice: error: cannot write standard output: …`, exit 1.
- **A file or directory this user may not use** (`PermissionError`: a store, a config or an
  output owned by another user or without the permission; or a read-only file system): one
  line naming it and what to do, exit 1, not a traceback.
- **Ctrl-C (SIGINT) and SIGTERM**: the command unwinds as on an error (its `finally` blocks
  and context managers run; the store is crash-safe in any case), then one line,
  `sluice: interrupted by SIGINT`, exit 130 (SIGTERM: 143). Commands that stop more gently
  (`sluice run`, `sluice collect`) install their own handlers while they run.
- **Text the terminal cannot show** (a C locale, `PYTHONIOENCODING=ascii`, a lone surrogate
  from bytes that are not UTF-8) is written as backslash escapes (`\\xe9`, `\\udcff`) on
  standard output, as Python already does on standard error, rather than failing.
- **Descriptors 0, 1 and 2 closed at start** (`<&-`, `>&-`, `2>&-`) are held open on
  /dev/null, so no store file or Spark log is given their numbers. Reading a closed
  standard input (`standard_input`) or writing a closed standard output is an error.

Callers in this process whose standard output is not the process's own (pytest's capture)
keep it as it is: only the real descriptor 1 is guarded.
"""

from __future__ import annotations

import errno
import io
import os
import pwd
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from types import FrameType
from typing import BinaryIO, Generic, TextIO, TypeVar

from pipeline.errors import Interrupted, OutputClosed, SluiceError, sigterm_interrupts

T = TypeVar("T")
#: The signals that end a command as Ctrl-C does.
INTERRUPTS = (signal.SIGINT, signal.SIGTERM)

#: The exit status when standard output's reader went away: 128 + SIGPIPE, as for `cat`.
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE
#: How much of standard input `lines_as_they_come` reads at once.
INPUT_CHUNK = 1 << 16
#: The exit status of a command that failed: a `SluiceError` (standard output failing is one).
EXIT_FAILED = 1


class OutputFailed(SluiceError):
    """Standard output cannot be written (a full device, a closed descriptor)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        msg = f"cannot write standard output: {reason}"
        super().__init__(msg)


class InputClosed(SluiceError):
    """Standard input was closed when the command started (`<&-`)."""

    def __init__(self) -> None:
        msg = (
            "standard input is closed: give the command a file or a pipe on it "
            "(`… < FILE`, `producer | sluice …`)"
        )
        super().__init__(msg)


def run_command(command: Callable[[], int]) -> int:
    """Run `command` (it prints its own errors and returns a status) under the module doc's
    rules, and return the process's exit status."""
    held = hold_standard_streams()
    try:
        with sigterm_interrupts():
            return _finished(command)
    except OutputClosed:
        return EXIT_OUTPUT_CLOSED
    except SluiceError as exc:
        if output_closed():  # what followed from it where another thread wrote the output
            return EXIT_OUTPUT_CLOSED  # (a job whose foreachBatch printed and failed)
        print(f"sluice: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as exc:
        if not isinstance(exc, PermissionError) and exc.errno != errno.EROFS:
            raise
        print(f"sluice: error: {access_refused(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"sluice: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    finally:
        held.restore()


def access_refused(exc: OSError) -> str:
    """What a `PermissionError` (or a write to a read-only file system) says to the user."""
    path = exc.filename if exc.filename is not None else "a file"
    if exc.errno == errno.EROFS:
        return f"{path} is on a read-only file system: Sluice must write there"
    try:
        user = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a user id with no name (a container's)
        user = f"user id {os.geteuid()}"
    return (
        f"permission denied: {path}: {user}, who runs sluice, may not use it; change its"
        " permissions (and its directory's), or run sluice as the user that owns it"
    )


def _finished(command: Callable[[], int]) -> int:
    """`command`'s status once what it printed is written (argparse's `--help` included)."""
    try:
        status = command()
    except SystemExit:  # argparse: --help, --version, a usage error (callers here expect it)
        sys.stdout.flush()  # a failure to write the help replaces it
        raise
    sys.stdout.flush()
    return status


def output_closed() -> bool:
    """True once the reader of the guarded standard output went away."""
    raw = getattr(getattr(sys.stdout, "buffer", None), "raw", None)
    return isinstance(raw, GuardedOutput) and raw.reader_gone


def standard_input() -> BinaryIO:
    """The process's standard input, as bytes; `InputClosed` when it was closed at start."""
    if sys.stdin is None:
        raise InputClosed
    return sys.stdin.buffer


def lines_as_they_come(source: BinaryIO, pause: float) -> Iterator[bytes | None]:
    """`source`'s lines (a command's standard input), each without its `\\n` and as soon as
    it has come (a last line without one too), and None once each time no whole line has come
    for `pause` seconds: the producer is slow or idle, the moment to make what was taken
    durable. Read in large chunks, as a file's lines are. A source with no descriptor to wait
    on (a test's) is read line by line, with no pauses."""
    try:
        fd = source.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        for line in source:
            yield line.removesuffix(b"\n")
        return
    parts: list[bytes] = []  # a line not ended yet
    paused = False
    while True:
        if not paused and not select.select([fd], [], [], pause)[0]:
            paused = True
            yield None
            continue
        chunk = source.read1(INPUT_CHUNK)  # type: ignore[attr-defined]
        if not chunk:
            if any(parts):
                yield b"".join(parts)
            return
        paused = False
        if b"\n" not in chunk:
            parts.append(chunk)
            continue
        *lines, rest = b"".join([*parts, chunk]).split(b"\n")
        parts = [rest]
        yield from lines


class Interruptible(Generic[T]):
    """`source`'s items (a command's standard input), read so that Ctrl-C or SIGTERM never
    cuts short the work on an item: one that comes while waiting for the next item ends the
    iteration at once, one that comes while the caller works on an item ends it after that
    item, and a second one raises at once. The caller keeps what it took (a writer flushed
    inside the block), then calls `raise_interrupt`. A context manager: it handles the
    signals inside its block (in the main thread)."""

    def __init__(self, source: Iterable[T]) -> None:
        self.source = iter(source)
        self.signum: int | None = None
        self._waiting = False
        self._earlier: dict[int, object] = {}

    def __enter__(self) -> Interruptible[T]:
        if threading.current_thread() is threading.main_thread():
            self._earlier = {s: signal.signal(s, self._handle) for s in INTERRUPTS}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._earlier.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        again, self.signum = self.signum is not None, self.signum or signum
        if self._waiting or again:
            raise Interrupted(signum)

    def __iter__(self) -> Iterator[T]:
        while self.signum is None:
            self._waiting = True
            try:
                item = next(self.source)
            except (StopIteration, Interrupted):
                return
            finally:
                self._waiting = False
            yield item

    def raise_interrupt(self) -> None:
        """End the command as the signal would have (`run_command`), if one came."""
        if self.signum is not None:
            raise Interrupted(self.signum)


class GuardedOutput(io.FileIO):
    """Descriptor 1, whose first failure is `OutputClosed` or `OutputFailed` (a descriptor
    closed at start fails its first write). From then on it points at /dev/null, so later
    writes and the flush at exit are silent: the failure is told once."""

    def __init__(self, closed_at_start: bool) -> None:
        super().__init__(1, "w", closefd=False)
        self.refused = "it was closed when the command started" if closed_at_start else None
        self.reader_gone = False

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.refused is not None:
            reason, self.refused = self.refused, None
            raise OutputFailed(reason)
        try:
            return super().write(data)
        except BrokenPipeError:
            self.reader_gone = True
            _point_at_null(1)
            raise OutputClosed from None
        except OSError as exc:
            _point_at_null(1)
            raise OutputFailed(exc.strerror or errno.errorcode.get(exc.errno or 0, "")) from None


class HeldStreams:
    """What `hold_standard_streams` replaced, to put back (for callers in this process)."""

    def __init__(self, stdout: TextIO | None, stderr: TextIO | None) -> None:
        self.stdout, self.stderr = stdout, stderr
        self.guarded = sys.stdout

    def restore(self) -> None:
        if sys.stdout is self.guarded and self.guarded is not self.stdout:
            sys.stdout = self.stdout  # type: ignore[assignment]
            try:
                self.guarded.close()  # what an interrupted command left in the buffer
            except (OutputClosed, OutputFailed):
                pass  # said already, or nothing to say after an interrupt
        sys.stderr = self.stderr  # type: ignore[assignment]


def hold_standard_streams() -> HeldStreams:
    """Hold closed descriptors 0-2 on /dev/null and guard the real standard output (module
    doc)."""
    held = HeldStreams(sys.stdout, sys.stderr)
    closed = {fd for fd in (0, 1, 2) if not _is_open(fd)}
    for fd in sorted(closed):
        _point_at_null(fd)
    if 2 in closed or sys.stderr is None:
        sys.stderr = open(2, "w", errors="backslashreplace", closefd=False)  # on /dev/null
    if sys.stdout is sys.__stdout__:  # not a test's capture
        original = sys.stdout
        guarded = io.TextIOWrapper(
            io.BufferedWriter(GuardedOutput(closed_at_start=1 in closed or original is None)),
            encoding=getattr(original, "encoding", None) or "utf-8",
            errors="backslashreplace",
            line_buffering=getattr(original, "line_buffering", False),
            write_through=getattr(original, "write_through", False),
        )
        if original is not None:
            original.flush()
        sys.stdout = guarded
        held.guarded = guarded
    return held


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _point_at_null(fd: int) -> None:
    """Make descriptor `fd` /dev/null (it stays taken: no file opened later gets it)."""
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
