"""Generator driver end to end: every sequence number once, in order, resumed after restart."""

from __future__ import annotations

import itertools
import json

from collectors.buffer import Buffer

from .conftest import read_payloads


def sequences(store_dir, stream) -> list[int]:
    return [s for p in read_payloads(store_dir, stream) for s in p["Sequence"]]


def test_every_sample_reaches_the_stream_once_in_order(make_config, service, store_dir):
    config = make_config(
        {
            "gen": {
                "driver": "generator",
                "stream": "lab/gen",
                "samples_per_sec": 200_000,
                "samples_per_event": 100,
                "max_samples": 5_000,
                "max_events_per_txn": 7,
                "routing_key": "edge-7",
            }
        }
    )
    assert service(config).wait() == 0  # ends by itself once max_samples are sent
    payloads = read_payloads(store_dir, "lab/gen")
    assert [s for p in payloads for s in p["Sequence"]] == list(range(5_000))
    first = payloads[0]
    assert list(first) == [
        "TimestampNanos",
        "Sequence",
        "Value",
        "Sensor",
        "RemoteAddr",
        "LastTimestampFormatted",
    ]
    assert first["Value"] == [s * 37 % 1000 for s in first["Sequence"]]
    assert (first["Sensor"], first["RemoteAddr"]) == ("gen", "edge-7")
    times = first["TimestampNanos"]
    assert times == sorted(times) and len(times) == 100
    assert all(5_000 - 10 <= b - a <= 5_000 + 10 for a, b in itertools.pairwise(times))


def test_a_restart_continues_the_sequence(make_config, service, store_dir):
    table = {"driver": "generator", "stream": "lab/gen", "samples_per_sec": 100_000}
    table |= {"samples_per_event": 250, "max_samples": 2_000}
    assert service(make_config({"gen": table})).wait() == 0
    table["max_samples"] = 3_500
    config = make_config({"gen": table})
    assert service(config).wait() == 0
    assert sequences(store_dir, "lab/gen") == list(range(3_500))
    buffer = Buffer(config.instances[0].buffer_file, 10)
    assert buffer.cursor("generator").value == {"next_seq": 3_500}
    assert buffer.depth() == 0
    assert buffer.counters()["samples_committed"] == 3_500


def test_events_carry_the_time_bounds_of_their_samples(make_config, service, store):
    config = make_config(
        {
            "gen": {
                "driver": "generator",
                "stream": "lab/gen",
                "samples_per_sec": 1_000,
                "samples_per_event": 100,
                "max_samples": 600,
            }
        }
    )
    assert service(config).wait() == 0
    events = list(store.read("lab/gen"))
    middle = json.loads(events[3].payload)["TimestampNanos"]
    start, end = store.time_cuts("lab/gen", middle[0], middle[-1] + 1)
    chosen = [json.loads(e.payload)["Sequence"][0] for e in store.read("lab/gen", start, end)]
    assert 300 in chosen and 0 not in chosen
