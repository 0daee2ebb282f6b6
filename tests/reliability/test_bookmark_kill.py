"""SIGKILL the bookmark job's driver at random points; the slices it records are exactly those
of an uninterrupted run over the same events, each recorded once."""

from __future__ import annotations

import json
import os

import pytest

from pipeline.jobs.slices import DEFAULT_SLICES_STREAM
from pipeline.streams import open_store
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload
from tests.spark.killing import job_env, kill_loop, run_to_completion, without_batch_limit

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KILLS = 10  # the mirror and export suites carry the 20-kill requirement
CALM, BURST = [10] * 10, [50_000] * 10  # bytes per 1 ms sample: 0.08 vs 400 Mbit/s
HOSTS = ("edge1", "edge2", "edge3")


def add_round(stores, k: int, counters: dict[str, int]) -> None:
    """One event per host at second k; bursts follow a fixed, host-specific pattern."""
    for n, host in enumerate(HOSTS):
        rates = BURST if (k + n) % 3 == 0 else CALM
        t0 = T0 + k * 1000 * MS
        payload = nic_payload(host, t0, counters[host], rates)
        counters[host] += sum(rates)
        for store in stores:  # the same transactions in the same order: the same offsets
            txn = store.begin_transaction(STREAM)
            txn.write(payload, routing_key=host)
            txn.commit(time_bounds=(t0, t0 + (len(rates) - 1) * MS))


def slice_events(store_uri: str) -> list[dict]:
    with open_store(store_uri) as store:
        if not store.stream_exists(DEFAULT_SLICES_STREAM):
            return []
        return [json.loads(e.payload) for e in store.read(DEFAULT_SLICES_STREAM)]


def test_bookmark_driver_killed_at_random_points(tmp_path):
    seed = int(os.environ.get("SLUICE_CRASH_SEED", "0")) or None
    edge, ref = f"embedded:{tmp_path / 'edge'}", f"embedded:{tmp_path / 'ref'}"
    stores = [open_store(edge), open_store(ref)]
    for store in stores:
        store.create_stream(STREAM, segments=2)
    counters = dict.fromkeys(HOSTS, 0)
    rounds = {"next": 0}

    def more_events(life: int) -> None:
        for _ in range(3):
            add_round(stores, rounds["next"], counters)
            rounds["next"] += 1

    job = [
        "run", "bookmark", "--stream", STREAM, "--schema", "NetworkSamples",
        "--burst-mbps", "50", "--max-events", "4",
    ]  # fmt: skip
    killed = kill_loop(
        ["--store", edge, *job, "--checkpoint", str(tmp_path / "ck")],
        job_env(tmp_path / "home"), KILLS, more_events, seed,
    )  # fmt: skip
    run_to_completion(
        without_batch_limit(["--store", edge, *job, "--checkpoint", str(tmp_path / "ck")]),
        job_env(tmp_path / "home"),
    )
    run_to_completion(
        without_batch_limit(["--store", ref, *job, "--checkpoint", str(tmp_path / "ck-ref")]),
        job_env(tmp_path / "home-ref"),
    )
    for store in stores:
        store.close()
    recorded, expected = slice_events(edge), slice_events(ref)
    assert killed >= KILLS
    assert expected, "the pattern has bursts: the uninterrupted run must record slices"
    ids = [s["slice_id"] for s in recorded]
    assert len(ids) == len(set(ids)), "a slice was recorded twice"
    strip = ("created_by", "created_ns", "created_at")
    assert sorted(
        json.dumps({k: v for k, v in s.items() if k not in strip}, sort_keys=True) for s in recorded
    ) == sorted(
        json.dumps({k: v for k, v in s.items() if k not in strip}, sort_keys=True) for s in expected
    )
