"""Listing slices: `sluice slices list` beside one plain read of the stream, in one run.

    .venv/bin/python benchmarks/slices.py [--events 20000] [--slices 1999]

One transaction writes `--events` small events (about 240 bytes, four sensors) into one
block, as a collector's commit after an outage does; `--slices` slices of ten events each
are recorded across it. Timed: what `sluice slices list` does (`list_slices`, then each
slice's extent: its events between its cuts, counted by sensor), against the least any
listing must do: one read of the whole stream, each slice's events then counted from the
events read (no second read). The ratio says how many whole-stream reads a listing costs.

Before the frames of a large block were kept between reads (commit 131f20e), each slice
parsed the whole block three times (its two cuts' boundary checks and its read). To see it,
run this script in a worktree of `131f20e^` (`git worktree add /tmp/before 131f20e^`, copy
the script in): 143.2 s for the default 1999 slices (ratio 947, tests running beside it),
against 5.35 s (ratio 55) on 131f20e's successors, on the same 2-core machine.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.jobs.slices import SliceExtent, SliceRecord, list_slices, record_slices
from pipeline.streams import StreamCut, open_store

STREAM = "bench/slices"


def prepare(uri: str, events: int, slices: int) -> None:
    with open_store(uri) as store:
        store.create_stream(STREAM, segments=1)
        txn = store.begin_transaction(STREAM)
        for i in range(events):
            txn.write(json.dumps({"i": i, "pad": "x" * 200}).encode(), routing_key=f"k{i % 4}")
        txn.flush()
        txn.commit()
        offsets = [e.offset for e in store.read(STREAM)]
        scope, name = STREAM.split("/")
        records = [
            SliceRecord.create(
                stream=STREAM,
                sensor="k1",
                start_cut=StreamCut.of(scope, name, {0: offsets[10 * j]}),
                end_cut=StreamCut.of(scope, name, {0: offsets[10 * j + 10]}),
                start_time_ns=0,
                end_time_ns=1,
                reason=f"slice {j}",
                created_by="benchmarks/slices.py",
            )
            for j in range(slices)
        ]
        record_slices(store, records)


def sluice_listing(uri: str) -> list[int]:
    """What `sluice slices list` computes: each slice's event count."""
    with open_store(uri) as store:
        return [SliceExtent.of(store, r).events or 0 for r in list_slices(store, STREAM)]


def one_read(uri: str) -> list[int]:
    """The least a listing does: the stream read once, each slice counted from it."""
    with open_store(uri) as store:
        records = list_slices(store, STREAM)
        events = [(e.offset, e.routing_key) for e in store.read(STREAM)]
    offsets = [offset for offset, _ in events]
    counts = []
    for r in records:
        start, end = (cut.segments[0] for cut in r.cuts)
        first, last = bisect.bisect_left(offsets, start), bisect.bisect_left(offsets, end)
        counts.append(sum(key == r.sensor for _, key in events[first:last]))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--slices", type=int, default=1999)
    parser.add_argument("--rounds", type=int, default=3, help="best of")
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)
    with tempfile.TemporaryDirectory(dir=os.environ.get("SLUICE_BENCH_DIR")) as tmp:
        uri = f"embedded:{tmp}"
        prepare(uri, args.events, args.slices)
        best: dict[str, float] = {}
        found: dict[str, list[int]] = {}
        for _ in range(args.rounds):
            for name, listing in (("sluice", sluice_listing), ("peer", one_read)):
                t0 = time.perf_counter()
                found[name] = listing(uri)
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        assert found["sluice"] == found["peer"], "the two listings disagree"
        assert len(found["sluice"]) == args.slices and sum(found["sluice"]) > 0
    what = f"slices list: {args.slices} slices of one {args.events}-event block"
    figure = Figure(what, "s", best["sluice"], best["peer"], "one read of the whole stream")
    print(
        f"{what}: sluice {figure.sluice:.2f} s   {figure.peer_name} {figure.peer:.2f} s   "
        f"ratio {figure.ratio:.1f}"
    )
    if args.write_results:
        print(f"wrote {recorder.write([figure])}")


if __name__ == "__main__":
    main()
