"""One segment's data file: appends under an exclusive lock, reads without one.

Appenders take `flock(LOCK_EX)` on the file (and a thread lock, since flock is per open file),
write a whole block at the valid end with one `pwritev`, `fdatasync`, and only then let the
block be indexed. Readers never lock: they read only indexed blocks, or validate a block's CRC
before they index it. Whoever holds the lock and finds bytes past the last valid block knows
no one is writing them: they are the torn tail of a crash, and it truncates them (repair).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.durable import fsync_dir
from pipeline.streams.embedded.blocks import HEADER, BlockHeader, block_is_intact, parse_header

SCAN_CHUNK = 1 << 20
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


class SegmentFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._thread_lock = threading.Lock()

    @property
    def fd(self) -> int:
        if self._fd is None:
            existed = self.path.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            if not existed:  # make the new file's and its new directory's entries durable
                for directory in (self.path.parent, *list(self.path.parents)[1:3]):
                    fsync_dir(directory)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @contextmanager
    def locked(self) -> Iterator[None]:
        with self._thread_lock:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    @contextmanager
    def try_locked(self) -> Iterator[bool]:
        """Yield True holding the lock, or False at once if another holder has it."""
        if not self._thread_lock.acquire(blocking=False):
            yield False
            return
        try:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def pread(self, length: int, offset: int) -> bytes:
        return os.pread(self.fd, length, offset)

    def scan(self, start: int) -> tuple[list[BlockHeader], int]:
        """Valid blocks from `start` on, and the end of the last one (the valid end).

        Stops at the first block that is incomplete or fails its CRC: past that point the
        file holds either a block still being written or the torn tail of a crash.
        """
        headers: list[BlockHeader] = []
        pos = start
        while True:
            head = self.pread(SCAN_CHUNK, pos)
            header = parse_header(head, 0, pos)
            if header is None:
                return headers, pos
            total = header.length
            data = head if len(head) >= total else self.pread(total, pos)
            meta_end = HEADER.size + len(header.meta)
            header_bytes = memoryview(data)[:meta_end]
            body = memoryview(data)[meta_end:total]
            if not block_is_intact(header, header_bytes, body):
                return headers, pos
            headers.append(header)
            pos += total

    def append(self, at: int, parts: list[bytes | memoryview]) -> int:
        """Write `parts` at `at` (the valid end), make them durable, and return the new end.

        Caller holds the lock. Bytes past `at` (a torn tail) are truncated first.
        """
        if self.size() != at:
            os.ftruncate(self.fd, at)
        written = os.pwritev(self.fd, parts, at)
        expected = sum(len(p) for p in parts)
        if written != expected:
            msg = f"short write to {self.path}: {written} of {expected} bytes (disk full?)"
            raise OSError(msg)
        os.fdatasync(self.fd)
        return at + written

    def repair(self, valid_end: int) -> bool:
        """Truncate a torn tail past `valid_end`; the caller holds the lock. True if repaired."""
        if self.size() <= valid_end:
            return False
        os.ftruncate(self.fd, valid_end)
        os.fdatasync(self.fd)
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
        libc.fallocate(
            ctypes.c_int(self.fd), ctypes.c_int(mode), ctypes.c_long(0), ctypes.c_long(length)
        )  # best effort: a file system without hole punching keeps the bytes, reads stay correct
