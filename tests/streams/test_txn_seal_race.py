"""A transaction committed while another handle seals its stream: `StreamSealed`, never a crash.

The committer is held at its segment's lock (taken here through `flock`, as every appender
takes it) after it has checked that the stream is writable; the stream is sealed meanwhile.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
from pathlib import Path

import pytest

from pipeline.streams import StreamSealed, open_store

STREAM = "race/sealed"


def waiting_on(path: Path) -> bool:
    """Whether some process or thread waits for an `flock` on `path` (`/proc/locks`)."""
    inode = os.stat(path).st_ino
    locks = Path("/proc/locks").read_text()
    return any(
        "->" in line and line.split()[-3].endswith(f":{inode}") for line in locks.splitlines()
    )


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs Linux's /proc/locks")
@pytest.mark.parametrize("flushed", [True, False], ids=["flushed", "in-memory"])
def test_commit_raced_by_seal_raises_stream_sealed(store_dir: Path, flushed: bool) -> None:
    with open_store(f"embedded:{store_dir}") as store, open_store(f"embedded:{store_dir}") as other:
        store.create_stream(STREAM)
        with store.writer(STREAM) as writer:  # the segment file exists, with one event
            writer.write(b"before", "k")
        txn = store.begin_transaction(STREAM)
        txn.write(b"in the transaction", "k")
        if flushed:
            txn.flush()
        (segment_path,) = store_dir.glob("data/*/0.seg")
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                txn.commit()
            except BaseException as exc:  # handed to the test thread
                outcome.append(exc)
            else:
                outcome.append(None)

        fd = os.open(segment_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            committer = threading.Thread(target=commit)
            committer.start()
            deadline = time.monotonic() + 30
            while not waiting_on(segment_path) and committer.is_alive():
                assert time.monotonic() < deadline, "the commit never reached the segment lock"
                time.sleep(0.01)
            other.seal_stream(STREAM)
        finally:
            os.close(fd)  # releases the lock
        committer.join(30)
        assert not committer.is_alive()
        (error,) = outcome
        assert isinstance(error, StreamSealed), repr(error)
        assert re.search(re.escape(f"stream {STREAM} is sealed"), str(error))
        assert txn.state() == "open"  # nothing of it landed; it can still be aborted
        assert [e.payload for e in other.read(STREAM)] == [b"before"]
        txn.abort()
