"""How fast a checked batch read can be here, step by step, beside a plain read of the bytes.

    .venv/bin/python benchmarks/read_floor.py [--events 2000]

The store `store.py` reads (64 KiB events, blocks of 16, 4 segments: 131 MB), read whole
with only the work each step of a checked batch read cannot leave out, each step added to
the ones before, beside a plain file read of the same payload bytes in 64 KiB `read`s (the
peer of `store.py`'s read rows). The ratios show what is left of issue 11's goal (a verified
bounded read at least 0.8x a plain read) for the store's own code once the checks are paid:

1. each block `preadv`ed into one reused page-aligned buffer, as the store reads its runs;
2. + its header unpacked (one struct);
3. + its checksum computed over the body;
4. + its frame heads checked (one struct over the whole body: these frames are all alike);
5. + the batch's columns made (each event's offset, payload start and end);
6. step 5 with the batch before still held while the next block is read (two buffers in
   turns), as any `for batch in store.read_batches(...)` holds it;
7. `store.read_batches` itself, the API the rows of `store.py` measure.

Best of several rounds, the contenders taken in turns; page cache warm.
"""

from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results import Figure, Recorder  # benchmarks/results.py, beside this script
from store import STREAM, file_appends, plain_read, sluice_appends  # the same data as store.py

from pipeline.streams import open_store
from pipeline.streams.embedded.blocks import EVENT as FRAME
from pipeline.streams.embedded.blocks import HEADER, checksum_for

Block = tuple[int, int]  # offset, length
STEPS = (
    "preadv into a reused buffer",
    "+ header unpacked",
    "+ checksum",
    "+ frame heads checked",
    "+ batch columns made",
    "+ the batch before held (two buffers)",
)


def segment_blocks(store_dir: Path) -> list[tuple[Path, list[Block]]]:
    """Each segment file of the stream and its indexed blocks (offset, length)."""
    with open_store(f"embedded:{store_dir}") as store:
        engine = store._engine
        row = engine.stream_row(STREAM)
        head, tail = store.head(STREAM), store.tail(STREAM)
        return [
            (
                engine.segment_file(row, seg).path,
                [(b.offset, b.length) for b in engine.blocks(row, seg, start, end)],
            )
            for seg, start, end in head.spans_until(tail)
        ]


def reader(files: list[tuple[Path, list[Block]]], step: int) -> Callable[[], int]:
    """A read of every block doing steps 1 to `step` (6: with two buffers); the payload bytes
    read (step 1: the blocks' bytes)."""
    largest = max(length for _, blocks in files for _, length in blocks)
    buffers = [memoryview(mmap.mmap(-1, largest)) for _ in range(2 if step == 6 else 1)]
    frames: dict[tuple[int, int], struct.Struct] = {}

    def read() -> int:
        total, turn, held = 0, 0, None
        for path, blocks in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                for offset, length in blocks:
                    view = buffers[turn % len(buffers)][:length]
                    turn += 1
                    got = os.preadv(fd, [view], offset)
                    if step < 2:
                        total += got
                        continue
                    fields = HEADER.unpack_from(view)
                    body_at = HEADER.size + fields[-1]
                    body = view[body_at:got]
                    if step >= 3:  # as the store chains it: the body, then the header
                        sums = checksum_for(fields[0])
                        sums(view[8:body_at], sums(body))
                    _, key_len, payload_len = FRAME.unpack_from(body)
                    head_len = FRAME.size + key_len
                    step_len = head_len + payload_len
                    if step >= 4:
                        shape = (head_len, payload_len)
                        frame = frames.get(shape) or frames.setdefault(
                            shape, struct.Struct(f"{head_len}s{payload_len}x")
                        )
                        heads = list(frame.iter_unpack(body))
                        assert heads.count(heads[0]) == len(heads)
                    if step >= 5:
                        at = offset + got - len(body)
                        held = (
                            view[:got].toreadonly(),
                            list(range(at, at + len(body), step_len)),
                            list(range(head_len, len(body), step_len)),
                            list(range(step_len, len(body) + 1, step_len)),
                        )
                    total += len(body) // step_len * payload_len
            finally:
                os.close(fd)
        del held
        return total

    return read


def measure(workdir: Path, events: int, rounds: int) -> list[Figure]:
    store_dir = workdir / "store-4"
    sluice_appends(store_dir, 4, 4, events // 4, 16)
    file_appends(workdir, 4, events // 4, 16)
    files = segment_blocks(store_dir)
    contenders: dict[str, Callable[[], int]] = {
        "plain": partial(plain_read, sorted(workdir.glob("plain-4-*"))),
        **{name: reader(files, i + 1) for i, name in enumerate(STEPS)},
    }
    with open_store(f"embedded:{store_dir}") as store:
        head, tail = store.head(STREAM), store.tail(STREAM)
        contenders["store.read_batches"] = lambda: sum(
            batch.nbytes for batch in store.read_batches(STREAM, head, tail)
        )
        best: dict[str, float] = {}
        sizes: dict[str, int] = {}
        for _ in range(rounds + 1):  # the first round warms the page cache
            for name, read in contenders.items():
                start = time.perf_counter()
                sizes[name] = read()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
    del sizes[STEPS[0]]  # (whole blocks: it parses nothing, so it cannot tell payloads apart)
    assert len(set(sizes.values())) == 1, f"the contenders read different bytes: {sizes}"
    nbytes = sizes["plain"]
    plain = nbytes / 1e6 / best.pop("plain")
    what = f"checked batch read ({nbytes / 1e6:.0f} MB, page cache), {{}}"
    return [
        Figure(what.format(name), "MB/s", nbytes / 1e6 / seconds, plain, "plain file read")
        for name, seconds in best.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=2000, help="64 KiB events in the store")
    parser.add_argument("--rounds", type=int, default=10, help="read rounds, the best counts")
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as tmp:
        figures = measure(Path(tmp), args.events, args.rounds)
    for f in figures:
        print(
            f"{f.what}: {f.sluice:8.2f} {f.unit}   {f.peer_name} {f.peer:8.2f} {f.unit}"
            f"   ratio {f.ratio:5.2f}"
        )
    if args.write_results:
        print(f"wrote {recorder.write(figures, [])}")


if __name__ == "__main__":
    main()
