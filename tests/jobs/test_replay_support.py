"""Helpers for the slice, bookmark and replay tests (no tests here): NIC events in a store.

Each event is one NetworkSamples JSON batch of one NIC (as the NIC collector writes), in its own
transaction with its time bounds, so `time_cuts` can find it and every event is one block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.streams import StreamStore

MS = 1_000_000
T0 = 1_793_527_200_000_000_000  # 2026-11-01T10:00:00Z
STREAM = "examples/network"


@dataclass(frozen=True)
class Written:
    key: str
    segment: int
    offset: int
    end_offset: int
    t_min: int
    t_max: int


def nic_payload(host: str, t0: int, rx0: int, rates: list[int], step_ns: int = MS) -> bytes:
    """Samples `step_ns` apart whose rx counter grows by `rates[i]` bytes per sample."""
    times, rx, tx = [], [], []
    total = rx0
    for i, rate in enumerate(rates):
        total += rate
        times.append(t0 + i * step_ns)
        rx.append(total)
        tx.append(total // 10)
    return json.dumps(
        {
            "RemoteAddr": host,
            "Interface": "eth0",
            "TimestampNanos": times,
            "RxBytes": rx,
            "TxBytes": tx,
        }
    ).encode()


def write_event(store: StreamStore, key: str, payload: bytes, bounds: tuple[int, int]) -> Written:
    txn = store.begin_transaction(STREAM)
    txn.write(payload, routing_key=key)
    txn.commit(time_bounds=bounds)
    events = [e for e in store.read(STREAM) if e.routing_key == key]
    last = events[-1]
    return Written(key, last.segment, last.offset, last.end_offset, *bounds)


def nic_stream(store: StreamStore, plan: dict[str, list[list[int]]], segments: int = 2) -> list:
    """Write, for each host, one event per entry of its list (per-sample byte deltas), the
    k-th events of all hosts at the same second k, hosts interleaved; return `Written`s."""
    store.create_stream(STREAM, segments=segments)
    written = []
    rounds = max(len(v) for v in plan.values())
    counters = dict.fromkeys(plan, 0)
    for k in range(rounds):
        for host, events in plan.items():
            if k >= len(events):
                continue
            t0 = T0 + k * 1000 * MS
            rates = events[k]
            payload = nic_payload(host, t0, counters[host], rates)
            counters[host] += sum(rates)
            bounds = (t0, t0 + (len(rates) - 1) * MS)
            written.append(write_event(store, host, payload, bounds))
    return written
