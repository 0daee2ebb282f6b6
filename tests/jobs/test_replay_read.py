"""The replay's read in Spark tasks gives exactly what a driver-side flatten of the slice gives.

The reference below is the replay's former read, kept here as it was: every event between the
cuts read on the driver (here straight from the store, as the `sluice` source's rows), one
`flatten` of them all, then the sensor and time filters and a stable sort by event time. The
tasks' read must give the same rows, in the same order, with the same types, the same
quarantine and the same event count, through either way back to the driver (spool files or
bytes through Spark), and the replay the same result and metrics files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.config import sluice_home
from pipeline.jobs.replay import load_model, read_slice, replay, run_model, spool_directory
from pipeline.jobs.slices import SliceRecord, record_slices
from pipeline.schemas import Events, FlattenPlan, flatten, flatten_plan
from pipeline.spark.reading import ARROW_SCHEMA
from pipeline.spark.replay_reader import CHUNK_ARROW, SliceBounds, SliceReader, slice_rows
from pipeline.streams import StreamCut
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload, write_event

pytestmark = pytest.mark.spark
SECOND = 1_000_000_000
HOSTS = ("edge1", "edge2", "edge3")


@pytest.fixture(scope="module")
def spark():
    from pipeline.spark.session import SparkSettings, spark_session

    return spark_session(SparkSettings(master="local[2]"))


@pytest.fixture(autouse=True)
def _no_sluice_toml(monkeypatch):
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")


@pytest.fixture
def stream(store) -> tuple[StreamCut, StreamCut]:
    """Three NICs over three segments, six one-second events each, the k-th events of all
    NICs at the same instants (ties across segments), ten samples 1 ms apart; malformed
    events of edge1 and edge2 (not JSON, unequal arrays) among them. Returns (head, tail)."""
    store.create_stream(STREAM, segments=3)
    counters = dict.fromkeys(HOSTS, 0)
    for k in range(6):
        for n, host in enumerate(HOSTS):
            rates = [(k + 1) * 100 * (n + 1) + i for i in range(10)]
            t0 = T0 + k * SECOND
            payload = nic_payload(host, t0, counters[host], rates)
            write_event(store, host, payload, (t0, t0 + 9 * MS))
            counters[host] += sum(rates)
        if k == 2:
            write_event(store, "edge1", b'{"RemoteAddr": "edge1", "Int', (t0, t0))
            bad = b'{"RemoteAddr":"edge2","Interface":"eth0","TimestampNanos":[1,2],'
            bad += b'"RxBytes":[1],"TxBytes":[1,2]}'
            write_event(store, "edge2", bad, (t0, t0))
    segments = {e.segment for e in store.read(STREAM)}
    assert len(segments) >= 2, segments  # the hosts spread over more than one segment
    return store.head(STREAM), store.tail(STREAM)


def _slice(store, cuts, sensor=None, sensor_by=None, bounds=(T0, T0 + 6 * SECOND)):
    record = SliceRecord.create(
        stream=STREAM,
        sensor=sensor,
        sensor_by=sensor_by,
        start_cut=cuts[0],
        end_cut=cuts[1],
        start_time_ns=bounds[0],
        end_time_ns=bounds[1],
        reason="test",
        created_by="test",
    )
    record_slices(store, [record])
    return record


#: Bounds that cut inside events: from the 4th sample of second 1 to the 6th of second 4.
INSIDE = (T0 + SECOND + 3 * MS, T0 + 4 * SECOND + 5 * MS)
SLICES = {
    "one key, cut inside events": {"sensor": "edge1", "bounds": INSIDE},
    "by columns, cut inside events": {
        "sensor": "edge2/eth0",
        "sensor_by": "RemoteAddr,Interface",
        "bounds": INSIDE,
    },
    "every sensor": {},
    "a sensor with no rows": {"sensor": "edge9"},
}


# --- the reference: the former driver-side read ---------------------------------------------


def _source_rows(store, record: SliceRecord) -> tuple[pa.Table, int]:
    """The `sluice` source's rows of the slice (of its key, when sliced by key), in stream
    order, and how many events lie between the cuts."""
    events = sorted(store.read(STREAM, *record.cuts), key=lambda e: (e.segment, e.offset))
    between = len(events)
    if record.sensor is not None and record.sensor_by in (None, "routing_key"):
        events = [e for e in events if e.routing_key == record.sensor]
    columns = {
        "stream": [STREAM] * len(events),
        "segment": [e.segment for e in events],
        "offset": [e.offset for e in events],
        "end_offset": [e.end_offset for e in events],
        "routing_key": [e.routing_key for e in events],
        "payload": [e.payload for e in events],
        "ingest_time": pa.array([e.ingest_time_ns // 1000 for e in events], pa.int64()),
    }
    columns["ingest_time"] = columns["ingest_time"].cast(pa.timestamp("us", tz="UTC"))
    return pa.table(columns, schema=ARROW_SCHEMA), between


def _reference(store, record: SliceRecord, plan: FlattenPlan) -> tuple[pa.Table, pa.Table, int]:
    events, between = _source_rows(store, record)
    out = flatten(plan, Events.from_arrow(events))
    rows = out.rows.append_column("_time_ns", pa.array(out.time_ns, pa.int64()))
    seg_e = events["segment"].to_numpy().astype(np.int64)
    off_e = events["offset"].to_numpy().astype(np.int64)
    span = int(off_e.max()) + 1 if len(off_e) else 1
    key_r = rows["_segment"].to_numpy().astype(np.int64) * span + rows["_offset"].to_numpy()
    owners = np.searchsorted(seg_e * span + off_e, key_r)
    keys = events["routing_key"].take(pa.array(owners, pa.int64()))
    rows = rows.append_column("_routing_key", keys)
    times = rows["_time_ns"]
    keep = pc.and_(
        pc.greater_equal(times, record.start_time_ns), pc.less_equal(times, record.end_time_ns)
    )
    if record.sensor is not None:
        if record.sensor_by in (None, "routing_key"):
            sensor = pc.equal(keys, record.sensor)
        else:
            names = [c.strip() for c in record.sensor_by.split(",")]
            parts = [pc.cast(rows[c], pa.string()) for c in names]
            sensor = pc.equal(pc.binary_join_element_wise(*parts, "/"), record.sensor)
        keep = pc.and_(keep, sensor)
    rows = rows.filter(keep)
    rows = rows.take(pa.array(np.argsort(rows["_time_ns"].to_numpy(), kind="stable")))
    bad = out.quarantine.sort_by([("_segment", "ascending"), ("_offset", "ascending")])
    return rows, bad, between


# --- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("through", ["spool", "spark"])
@pytest.mark.parametrize("name", list(SLICES))
def test_the_tasks_read_the_rows_a_driver_side_flatten_gives(spark, store, stream, name, through):
    plan = flatten_plan("NetworkSamples")
    record = _slice(store, stream, **SLICES[name])
    expected, bad, between = _reference(store, record, plan)
    with spool_directory(spark, sluice_home()) as spool:
        assert spool is not None  # a local master: the executors see this machine's files
        rows, quarantine, events = read_slice(
            spark, store.uri, record, plan, spool if through == "spool" else None
        )
    assert rows.schema == expected.schema
    assert rows.equals(expected)
    assert quarantine.equals(bad)
    assert events == between
    if name == "one key, cut inside events":
        assert rows.num_rows == 7 + 2 * 10 + 6 and quarantine.num_rows == 1
        assert set(rows["_routing_key"].to_pylist()) == {"edge1"}
    if name == "every sensor":
        assert len(set(rows["_segment"].to_pylist())) >= 2 and quarantine.num_rows == 2
    assert not (sluice_home() / "spool").exists()  # the spool is gone with the read


@pytest.mark.parametrize("name", list(SLICES))
def test_a_replay_writes_the_files_of_the_reference(spark, store, stream, tmp_path, name):
    plan = flatten_plan("NetworkSamples")
    record = _slice(store, stream, **SLICES[name])
    model = load_model("pipeline.models.nic:throughput", {"burst_mbps": 1.0})
    result = replay(spark, store, record.slice_id, model, plan=plan, home=sluice_home())
    rows, bad, between = _reference(store, record, plan)
    results, model_metrics = run_model(model, rows.to_pandas())
    pq.write_table(results, tmp_path / "results.parquet", compression="zstd")
    written = Path(result.lineage.results_path).read_bytes()
    assert written == (tmp_path / "results.parquet").read_bytes()
    metrics = json.loads(Path(result.lineage.metrics_path).read_text())
    assert metrics["model_metrics"] == json.loads(json.dumps(model_metrics))
    assert (metrics["input_events"], metrics["input_rows"]) == (between, rows.num_rows)
    assert metrics["quarantined_events"] == bad.num_rows
    assert metrics["quarantine_reasons"] == sorted(set(bad["reason"].to_pylist()))
    assert metrics["output_rows"] == results.num_rows


def test_an_empty_slice_reads_nothing_and_has_the_columns_of_any_other(spark, store, stream):
    plan = flatten_plan("NetworkSamples")
    tail = stream[1]
    record = _slice(store, (tail, tail))
    expected, bad, between = _reference(store, record, plan)
    rows, quarantine, events = read_slice(spark, store.uri, record, plan)
    assert (rows.num_rows, quarantine.num_rows, events, between) == (0, 0, 0, 0)
    assert rows.schema == expected.schema and quarantine.schema == bad.schema
    assert rows.to_pandas().dtypes.equals(expected.to_pandas().dtypes)
    model = load_model("pipeline.models.nic:throughput")
    result = replay(spark, store, record.slice_id, model, plan=plan, home=sluice_home())
    assert (result.metrics["input_events"], result.metrics["output_rows"]) == (0, 0)


def test_many_small_chunks_merge_into_the_order_of_one_flatten(store, stream):
    """The task side and the driver's merge without Spark: every event its own chunk, so the
    merge interleaves chunks of several segments whose rows share instants."""
    plan = flatten_plan("NetworkSamples")
    record = _slice(store, stream, bounds=INSIDE)
    expected, bad, between = _reference(store, record, plan)
    bounds = SliceBounds(None, None, *INSIDE)
    reader = SliceReader(plan, bounds)
    singles = [
        Events(STREAM, [e.payload], [e.segment], [e.offset], [e.routing_key], [e.ingest_time_ns])
        for e in reversed(list(store.read(STREAM, *record.cuts)))  # the driver sorts them
    ]
    chunks = pa.Table.from_batches([reader.chunk(e) for e in singles], schema=CHUNK_ARROW)
    rows, quarantine, events = slice_rows(chunks, plan)
    assert rows.equals(expected) and quarantine.equals(bad) and events == between
