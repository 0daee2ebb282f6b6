"""Mirror: events/s and MB/s of `sluice run mirror` beside a raw store-to-store copy.

    .venv/bin/python benchmarks/mirror.py [--events 50000] [--samples 100]

The same stream is copied between two embedded stores by the mirror job (Spark `local[2]`,
exactly-once) and by one plain Python process through store transactions of 10,000 events
(the same durability, no Spark, no ledger): the ceiling a copy can reach. Both targets are
checked before figures print. Details: `benchmarks/README.md`."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from results import Figure, Recorder  # benchmarks/results.py, beside this script

from pipeline.jobs.mirror import MirrorSpec, mirror
from pipeline.jobs.runner import RunOptions
from pipeline.spark.session import SparkSettings, spark_session
from pipeline.streams import StreamStore, open_store


def nic_payload(i: int, samples: int) -> bytes:
    t0 = 1_609_363_757_807_000_000 + i * samples * 1_000_000
    event = {
        "TimestampNanos": [t0 + k * 1_000_000 for k in range(samples)],
        "RxBytes": [719_763_680 + i * samples + k for k in range(samples)],
        "TxBytes": [4_594_274 + k for k in range(samples)],
        "RemoteAddr": "ubuntu",
        "Interface": f"ens{i % 4}",
    }
    return json.dumps(event, separators=(",", ":")).encode()


def prepare(uri: str, stream: str, events: int, samples: int) -> int:
    size = 0
    with open_store(uri) as store:
        store.create_stream(stream, segments=2)
        for start in range(0, events, 1000):
            txn = store.begin_transaction(stream)
            for i in range(start, min(events, start + 1000)):
                payload = nic_payload(i, samples)
                txn.write(payload, f"ens{i % 4}")
                size += len(payload)
            txn.commit()
    return size


def raw_copy(source: StreamStore, target: StreamStore, stream: str, to: str) -> int:
    target.create_stream(to, segments=2)
    copied = 0
    txn = target.begin_transaction(to)
    for event in source.read(stream):
        txn.write(event.payload, event.routing_key)
        copied += 1
        if copied % 10_000 == 0:
            txn.commit()
            txn = target.begin_transaction(to)
    txn.commit()
    return copied


def check(uri: str, stream: str, expected: list[bytes], label: str) -> None:
    with open_store(uri) as store:
        got = sorted(e.payload for e in store.read(stream))
    if got != expected:
        msg = f"{label}: the copy differs from the source ({len(got)} vs {len(expected)} events)"
        raise SystemExit(msg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=100)
    Recorder.add_option(parser)
    args = parser.parse_args()
    recorder = Recorder(__file__, __doc__)
    root = Path(tempfile.mkdtemp(prefix="sluice-bench-mirror-"))
    edge, cloud = f"embedded:{root / 'edge'}", f"embedded:{root / 'cloud'}"
    size = prepare(edge, "bench/net", args.events, args.samples)
    prepare(edge, "bench/warm", 200, args.samples)
    with open_store(edge) as store:
        expected = sorted(e.payload for e in store.read("bench/net"))
    print(f"{args.events} events, {size / 1e6:.0f} MB, {size // args.events} bytes each")

    spark = spark_session(SparkSettings(master="local[2]", app_name="bench-mirror"))
    warm = MirrorSpec("bench/warm", "cloud/warm", edge, cloud)
    mirror(spark, warm, RunOptions(checkpoint=root / "ck-warm"))

    started = time.perf_counter()
    spec = MirrorSpec("bench/net", "cloud/net", edge, cloud)
    summary = mirror(spark, spec, RunOptions(checkpoint=root / "ck"))
    sluice = time.perf_counter() - started
    check(cloud, "cloud/net", expected, "sluice mirror")

    with open_store(edge) as source, open_store(cloud) as target:
        started = time.perf_counter()
        raw_copy(source, target, "bench/net", "raw/net")
        raw = time.perf_counter() - started
    check(cloud, "raw/net", expected, "raw copy")

    started = time.perf_counter()  # the same job again, nothing new to copy: its fixed cost
    mirror(spark, spec, RunOptions(checkpoint=root / "ck"))
    fixed = time.perf_counter() - started

    for label, seconds in (("sluice mirror", sluice), ("raw copy", raw)):
        print(
            f"  {label:<14} {seconds:6.2f} s  {args.events / seconds:9.0f} events/s"
            f"  {size / seconds / 1e6:6.1f} MB/s"
        )
    batch = sum(b.duration_ms for b in summary.batches) / 1000
    print(f"  ({summary.events} events in {len(summary.batches)} batch(es) of {batch:.2f} s)")
    print(f"  a mirror run with nothing to copy takes {fixed:.2f} s (query start, checkpoint)")
    print(f"sluice mirror / raw copy = {raw / sluice:.2f}x")
    shutil.rmtree(root, ignore_errors=True)
    if args.write_results:
        what = f"mirror {args.events} events ({size / 1e6:.0f} MB), {args.samples} samples each"
        figures = [
            Figure(what, "events/s", args.events / sluice, args.events / raw, "raw copy"),
            Figure(what, "MB/s", size / sluice / 1e6, size / raw / 1e6, "raw copy"),
            Figure("mirror run with nothing to copy (fixed cost)", "s", fixed),
        ]
        print(f"wrote {recorder.write(figures)}")


if __name__ == "__main__":
    main()
