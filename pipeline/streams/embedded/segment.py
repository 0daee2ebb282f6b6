"""One segment's data file: appends under an exclusive lock, reads without one.

Appenders take `flock(LOCK_EX)` on the file (and a thread lock, since flock is per open file),
write a whole block at the valid end with one `pwritev`, `fdatasync`, and only then let the
block be indexed. Readers never lock: they read only indexed blocks, or validate a block's CRC
before they index it. Whoever holds the lock and finds bytes past the last valid block knows
no one is writing them: they are the torn tail of a crash, cut unless a valid block follows
them (then they are damage, left for `repair`). A full disk raises `StoreFull` after the
half-written block is cut away again.

Threads of one process share a segment file's descriptor. Every use holds it open (`opened`):
a `close` meanwhile (its stream deleted, the store closed) closes it after the last use, so a
read or write in flight never meets a descriptor number that a later `open` in the process got.
A file closed with a refusal (`StreamNotFound` for a deleted stream) raises it from every later
use, and is never opened again (nor created again).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import FileModes
from pipeline.durable import fsync_dir
from pipeline.streams.embedded.blocks import (
    HEADER,
    MAGIC_PREFIX,
    MAX_META,
    BlockHeader,
    block_is_intact,
    parse_header,
)
from pipeline.streams.embedded.space import out_of_space
from pipeline.streams.errors import StreamStoreError

SCAN_CHUNK = 1 << 20
#: The most buffers one `pwritev` takes (a crash between two leaves a torn block, never a
#: valid one: the CRC covers the whole block).
IOV_MAX = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


def _intact(header: BlockHeader, block: memoryview) -> bool:
    meta_end = HEADER.size + len(header.meta)
    return block_is_intact(header, block[:meta_end], block[meta_end:])


@dataclass(frozen=True, slots=True)
class Survey:
    """What a segment file holds from some offset on: its valid blocks, the byte ranges that
    are no valid block but have valid blocks after them (damage), and a torn tail (invalid
    bytes up to the end of the file, nothing valid after them)."""

    blocks: list[BlockHeader]
    damaged: list[tuple[int, int]]
    torn_tail: tuple[int, int] | None
    size: int


class SegmentFile:
    def __init__(self, path: Path, modes: FileModes | None = None) -> None:
        self.path = path
        self.modes = modes or FileModes.from_environment()
        self._fd: int | None = None
        self._users = 0  # uses in flight (`opened`); the descriptor is closed only at 0
        self._closing = False
        self._refusal: StreamStoreError | None = None
        self._state = threading.Lock()  # of the four above, held briefly
        self._thread_lock = threading.Lock()  # held by an appender, for as long as it appends

    @contextmanager
    def opened(self, create: bool = True) -> Iterator[int]:
        """The open descriptor, kept open until the block ends (opened if it is not; the file
        created unless `create` is false: then `FileNotFoundError`)."""
        fd = self._hold(create)
        try:
            yield fd
        finally:
            self._let_go()

    def _hold(self, create: bool = True) -> int:
        """The open descriptor, one more use in flight (`_let_go` ends it): a `with` costs
        more than a small read, so the reads use these two directly."""
        with self._state:
            if self._refusal is not None:
                raise self._refusal
            if self._fd is None:
                self._fd = self._open(create)
            self._users += 1
            return self._fd

    def _let_go(self) -> None:
        with self._state:
            self._users -= 1
            if self._closing and self._users == 0:
                self._close_now()

    @property
    def fd(self) -> int:
        """The descriptor, for a caller that holds it open (`opened`, `locked`)."""
        with self.opened() as fd:
            return fd

    def _open(self, create: bool) -> int:
        if not create:  # a read: a file that is not there is not made (`FileNotFoundError`)
            return os.open(self.path, os.O_RDWR)
        existed = self.path.exists()
        with out_of_space(self.path):
            self.path.parent.mkdir(mode=self.modes.directory, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, self.modes.file)
            if not existed:  # make the new file's and its new directory's entries durable
                for directory in (self.path.parent, *list(self.path.parents)[1:3]):
                    fsync_dir(directory)
        return fd

    def close(self, refusal: StreamStoreError | None = None) -> None:
        """Close the descriptor once no use is in flight. With `refusal`, every later use
        raises it instead of opening the file again (a deleted stream's, a closed store's)."""
        with self._state:
            if refusal is not None:
                self._refusal = refusal
            if self._users:
                self._closing = True
            else:
                self._close_now()

    def _close_now(self) -> None:
        self._closing = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self._thread_lock, self.opened() as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    @contextmanager
    def try_locked(self) -> Iterator[bool]:
        """Yield True holding the lock, or False at once if another holder has it."""
        if not self._thread_lock.acquire(blocking=False):
            yield False
            return
        try:
            with self.opened() as fd:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    yield False
                    return
                try:
                    yield True
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def size(self) -> int:
        """The file's size; 0 if there is no file (none is made)."""
        try:
            with self.opened(create=False) as fd:
                return os.fstat(fd).st_size
        except FileNotFoundError:
            return 0

    def pread(self, length: int, offset: int) -> bytes:
        """Up to `length` bytes from `offset` (none if there is no file: reads make none)."""
        try:
            fd = self._hold(create=False)
        except FileNotFoundError:
            return b""
        try:
            return os.pread(fd, length, offset)
        finally:
            self._let_go()

    def read_into(self, buffer: memoryview, offset: int) -> int:
        """Read into `buffer` from `offset`; the number of bytes read (0 if there is no
        file: reads make none)."""
        try:
            fd = self._hold(create=False)
        except FileNotFoundError:
            return 0
        try:
            return os.preadv(fd, [buffer], offset)
        finally:
            self._let_go()

    def sync(self) -> None:
        with self.opened() as fd:
            os.fdatasync(fd)

    def scan(self, start: int) -> tuple[list[BlockHeader], int]:
        """Valid blocks from `start` on, and the end of the last one (the valid end).

        Stops at the first block that is incomplete or fails its CRC: past that point the
        file holds either a block still being written, the torn tail of a crash, or damage.
        Small blocks are checked many to a read.
        """
        headers: list[BlockHeader] = []
        pos, size = start, self.size()
        while pos < size:
            data = memoryview(self.pread(min(SCAN_CHUNK, size - pos), pos))
            off = 0
            while (header := parse_header(data, off, pos + off)) is not None:
                if header.length > size - (pos + off):
                    return headers, pos + off  # runs past the end of the file: incomplete
                if off + header.length > len(data):
                    if off == 0:  # one block larger than a read: read it whole
                        data = memoryview(self.pread(header.length, pos))
                    else:
                        break
                if not _intact(header, data[off : off + header.length]):
                    return headers, pos + off
                headers.append(header)
                off += header.length
            if off == 0:
                return headers, pos
            pos += off
        return headers, pos

    def valid_block(self, pos: int, size: int) -> BlockHeader | None:
        """The header of the valid block (whole, CRC matching) at `pos`, or None."""
        header = parse_header(self.pread(HEADER.size + MAX_META, pos), 0, pos)
        if header is None or header.length > size - pos:
            return None
        return header if _intact(header, memoryview(self.pread(header.length, pos))) else None

    def next_valid_block(self, after: int) -> int | None:
        """Where the first valid block that starts after `after` lies, if any: bytes that fail
        their check with a valid block after them are damage, not a torn tail."""
        size = self.size()
        pos = after + 1
        while pos < size:
            chunk = self.pread(SCAN_CHUNK + len(MAGIC_PREFIX) - 1, pos)
            found = chunk.find(MAGIC_PREFIX)
            while 0 <= found < SCAN_CHUNK:
                if self.valid_block(pos + found, size) is not None:
                    return pos + found
                found = chunk.find(MAGIC_PREFIX, found + 1)
            pos += SCAN_CHUNK
        return None

    def survey(self, start: int) -> Survey:
        """Every valid block from `start` on, reading through damage (see `Survey`)."""
        blocks: list[BlockHeader] = []
        damaged: list[tuple[int, int]] = []
        pos, size = start, self.size()
        while True:
            headers, end = self.scan(pos)
            blocks += headers
            if end >= size:
                return Survey(blocks, damaged, None, size)
            later = self._resume_after(end, size)
            if later is None:
                return Survey(blocks, damaged, (end, size), size)
            damaged.append((end, later))
            pos = later

    def _resume_after(self, bad: int, size: int) -> int | None:
        """Where valid blocks resume after the invalid block at `bad`: right after it when its
        header still tells its length, else at the first valid block found after it."""
        header = parse_header(self.pread(HEADER.size + MAX_META, bad), 0, bad)
        if header is not None and header.end < size and self.valid_block(header.end, size):
            return header.end
        return self.next_valid_block(bad)

    def append(self, at: int, parts: list[bytes | memoryview]) -> int:
        """Write `parts` at `at` (the valid end), make them durable, and return the new end.

        Caller holds the lock and has checked that bytes past `at` are a torn tail: they are
        truncated first. On a full disk what was written is cut away again (`StoreFull`).
        """
        end = at
        with self.opened() as fd, out_of_space(self.path, undo=lambda: os.ftruncate(fd, at)):
            if os.fstat(fd).st_size != at:
                os.ftruncate(fd, at)
            for first in range(0, len(parts), IOV_MAX):  # a block of many small events
                group = parts[first : first + IOV_MAX]
                expected = sum(len(p) for p in group)
                written = os.pwritev(fd, group, end)
                if written != expected:
                    msg = f"short write: {written} of {expected} bytes"
                    raise OSError(errno.ENOSPC, msg)
                end += written
            os.fdatasync(fd)
        return end

    def repair(self, valid_end: int) -> bool:
        """Truncate a torn tail past `valid_end`; the caller holds the lock. True if repaired."""
        with self.opened() as fd:
            if os.fstat(fd).st_size <= valid_end:
                return False
            os.ftruncate(fd, valid_end)
            os.fdatasync(fd)
        return True

    def punch_hole(self, end: int) -> None:
        """Free the disk space of bytes [0, end) without moving any offset (Linux only)."""
        page = 4096
        length = (end // page) * page
        if length <= 0:
            return
        libc_name = ctypes.util.find_library("c")
        if not libc_name:
            return
        libc = ctypes.CDLL(libc_name, use_errno=True)
        mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
        # best effort: a file system without hole punching keeps the bytes, reads stay correct
        with self.opened() as fd:
            libc.fallocate(
                ctypes.c_int(fd), ctypes.c_int(mode), ctypes.c_long(0), ctypes.c_long(length)
            )
