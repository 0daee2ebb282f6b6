"""Sensor names of flattened rows: one definition for the bookmark job and the replay."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from pipeline.jobs.bookmark import BookmarkSpec, Condition, process_batch
from pipeline.schemas import Events, flatten, flatten_plan
from pipeline.schemas.sensors import sensor_columns, sensor_names
from pipeline.spark.replay_reader import SliceBounds, _sensor_by_columns
from tests.jobs.test_bookmark import source_rows

STREAM = "examples/accel"
T0 = 1_793_527_200_000_000_000
MS = 1_000_000


def test_each_type_as_text_joined_with_a_slash_and_null_when_a_part_is_null():
    rows = pa.table(
        {
            "host": ["a", "b", None, "d"],
            "port": pa.array([7, None, 9, 10], pa.int64()),
            "gain": [1.0, 2.5, 3.0, -0.5],
            "on": [True, False, True, False],
            "site": pa.array(["x", "y", "x", "y"]).dictionary_encode(),
        }
    )
    assert sensor_names(rows, "host").to_pylist() == ["a", "b", None, "d"]
    assert sensor_names(rows, "host, port").to_pylist() == ["a/7", None, None, "d/10"]
    assert sensor_names(rows, "gain,on").to_pylist() == [
        "1/true",
        "2.5/false",
        "3/true",
        "-0.5/false",
    ]
    assert sensor_names(rows, "site,host").to_pylist() == ["x/a", "y/b", None, "y/d"]
    assert sensor_columns(" host , port") == ["host", "port"]
    with pytest.raises(KeyError, match="nope"):
        sensor_names(rows, "host,nope")


def accel_payload(host: str, stamp: str | None, t0: int, values: list[float]) -> bytes:
    times = [t0 + i * MS for i in range(len(values))]
    event = {"RemoteAddr": host, "TimestampNanos": times, "X": values, "Y": values, "Z": values}
    event["LastTimestampFormatted"] = stamp
    return json.dumps(event).encode()


def test_the_bookmark_names_sensors_as_the_replay_keeps_them(store, tmp_path):
    """Rows whose sensor columns hold a null belong to no sensor (no slice, never a crash);
    every slice's sensor keeps, in the replay's filter, exactly the rows it was made of."""
    store.create_stream(STREAM)
    events = [
        ("h1", "2026-11-01T10:00:00Z", [9.5, 9.6]),
        ("h1", None, [9.7, 9.8]),
        ("h2", "2026-11-01T10:00:00Z", [1.0, 9.9]),
    ]
    writer = store.writer(STREAM)
    for i, (host, stamp, values) in enumerate(events):
        writer.write(accel_payload(host, stamp, T0 + i * 1000 * MS, values), host)
    writer.flush()
    table = source_rows(store.read(STREAM))
    sensor_by = "RemoteAddr,LastTimestampFormatted"
    spec = BookmarkSpec(
        STREAM,
        "AccelerometerSamples",
        f"embedded:{tmp_path / 'streams'}",
        (Condition("above", field="X", value=9.0),),
        sensor_by,
    )
    plan = flatten_plan("AccelerometerSamples")
    process_batch(store, spec, plan, tmp_path / "state", batch_id=0, events=table)
    # a run closes when its sensor's next event has no hit: one more event per sensor
    more = [("h1", "2026-11-01T10:00:00Z", [0.0]), ("h2", "2026-11-01T10:00:00Z", [0.0])]
    for i, (host, stamp, values) in enumerate(more, start=len(events)):
        writer.write(accel_payload(host, stamp, T0 + i * 1000 * MS, values), host)
    writer.flush()
    seen = max(table.column("end_offset").to_pylist())
    rest_table = source_rows(e for e in store.read(STREAM) if e.offset >= seen)
    slices = process_batch(store, spec, plan, tmp_path / "state", batch_id=1, events=rest_table)
    assert sorted(s.sensor for s in slices) == [
        "h1/2026-11-01T10:00:00Z",
        "h2/2026-11-01T10:00:00Z",
    ]
    rows = flatten(plan, Events.from_arrow(table)).rows
    for record in slices:
        bounds = SliceBounds(record.sensor, record.sensor_by, T0, T0 + 10_000 * MS)
        kept = rows.filter(pa.array(_sensor_by_columns(rows, bounds)))
        host = record.sensor.split("/")[0]
        assert set(kept.column("RemoteAddr").to_pylist()) == {host}
        assert None not in kept.column("LastTimestampFormatted").to_pylist()
        assert np.all(np.asarray(kept.column("X")) >= 0)
