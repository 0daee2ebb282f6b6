"""Fixtures of the Dagster tests: the repository's sluice.toml under the test's own home."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from pipeline.streams import open_store

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        yield inst


SECOND = 1_000_000_000
START_NS = 1_800_000_000 * SECOND


def network_payload(
    first: int,
    count: int,
    *,
    step_ns: int = SECOND // 10,
    host: str = "h1",
    counter0: int = 0,
    bytes_per_sample: int = 1000,
) -> bytes:
    """One NetworkSamples event: `count` samples from sample number `first`, `step_ns` apart,
    counters growing by `bytes_per_sample` from `counter0`."""
    stamps = [START_NS + (first + i) * step_ns for i in range(count)]
    counters = [counter0 + bytes_per_sample * (i + 1) for i in range(count)]
    sample = {
        "RemoteAddr": host,
        "Interface": "eth0",
        "TimestampNanos": stamps,
        "RxBytes": counters,
        "TxBytes": counters,
    }
    return json.dumps(sample).encode()


def nic_events(bytes_per_sample: list[int], per_event: int = 10) -> list[bytes]:
    """One event per entry: 10 samples 0.1 s apart, each adding that many bytes (1000 bytes
    per 0.1 s is 0.08 Mbit/s; 100_000 is 8 Mbit/s, a burst)."""
    events, counter = [], 0
    for e, step in enumerate(bytes_per_sample):
        events.append(
            network_payload(e * per_event, per_event, counter0=counter, bytes_per_sample=step)
        )
        counter += step * per_event
    return events


def write_events(uri: str, stream: str, payloads: list[bytes], key: str = "h1") -> None:
    """Commit `payloads` to `stream` in one transaction (as a collector does)."""
    with open_store(uri) as store:
        store.create_stream(stream)
        txn = store.begin_transaction(stream)
        for payload in payloads:
            txn.write(payload, routing_key=key)
        txn.flush()
        txn.commit()


def samples(events: int, per_event: int = 10, first_event: int = 0) -> list[bytes]:
    """`events` quiet NIC events (no burst) continuing from event `first_event`."""
    return [
        network_payload(
            (first_event + e) * per_event,
            per_event,
            counter0=(first_event + e) * per_event * 1000,
        )
        for e in range(events)
    ]


def materialized(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    """Asset key -> metadata values of every materialization in the run."""
    found = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        found[mat.asset_key.to_user_string()] = {k: v.value for k, v in mat.metadata.items()}
    return found


def tail_text(uri: str, stream: str) -> str:
    with open_store(uri) as store:
        return store.tail(stream).text


def head_text(uri: str, stream: str) -> str:
    with open_store(uri) as store:
        return store.head(stream).text


def mirror_lag_evaluation(settings, instance) -> dg.AssetCheckEvaluation:
    """The network family's `mirror_lag` check, evaluated now."""
    from assets.definitions import build_resources
    from assets.family import family_definitions

    family = family_definitions(settings.family("network"), settings)
    (lag,) = [c for c in family.checks if "mirror_lag" in str(c.check_keys)]
    result = dg.materialize(
        [*family.assets, lag],
        selection=dg.AssetSelection.checks(*lag.check_keys),
        instance=instance,
        resources=build_resources(settings),
    )
    (evaluation,) = result.get_asset_check_evaluations()
    return evaluation
