"""A reader process for the reader-group tests; several run at once, some are killed (-9).

    python group_worker.py STORE_DIR STREAM GROUP READER OUT_FILE STOP_FILE [TIMEOUT_S]

It joins GROUP as READER and loops: read a batch, append one line per event to OUT_FILE
("<monotonic ns> <segment> <offset> <payload>", written before the commit, so a killed reader
may have written events it had not committed), commit. It leaves the group (`close`) when a
read finds nothing and STOP_FILE exists. TIMEOUT_S sets `READER_TIMEOUT_S`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pipeline.streams import open_store
from pipeline.streams.embedded import readers
from pipeline.streams.errors import ReaderOffline


def main() -> None:
    store_dir, stream, group, reader_id, out_file, stop_file = sys.argv[1:7]
    if len(sys.argv) > 7:
        readers.READER_TIMEOUT_S = float(sys.argv[7])
    store = open_store(f"embedded:{store_dir}")
    reader = store.reader_group(group, stream).reader(reader_id)
    out = os.open(out_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("joined", flush=True)
    while True:
        events = reader.read(50, timeout=0.1)
        lines = [
            f"{time.monotonic_ns()} {e.segment} {e.offset} {e.payload.decode()}\n" for e in events
        ]
        if lines:
            os.write(out, "".join(lines).encode())
        try:
            reader.commit()
        except ReaderOffline:
            pass  # presumed dead while busy: its uncommitted events are read again elsewhere
        if not events and Path(stop_file).exists():
            break
    reader.close()
    store.close()


if __name__ == "__main__":
    main()
