"""Every path between Spark and pandas, under the installed pandas (3.x in the lock).

PySpark warns that it does not fully support pandas 3; that concerns its own pandas
conversions (`toPandas`, `createDataFrame` of a pandas frame, pandas UDFs, pandas-on-Spark),
which Sluice does not use: its Spark data leaves as Arrow (`toArrow`, the `sluice` sources'
and sinks' Arrow batches), and pandas sees it only after pyarrow converts it on the driver,
for replay models and bookmark predicates. These tests hold both halves: no PySpark pandas
conversion in the code, and each path exact for the values pandas 3 treats differently
(nanosecond integers beyond 2^53, text, binary, time zones)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import sluice_home
from pipeline.jobs.replay import load_model, replay
from pipeline.jobs.slices import record_slices, time_window_slice
from pipeline.models.join import join as join_model
from pipeline.schemas import flatten_plan
from pipeline.timejoin import join_tables
from tests.jobs.test_replay_support import STREAM, T0, nic_stream

REPO = Path(__file__).resolve().parents[2]
SECOND = 1_000_000_000

#: PySpark's own pandas conversions: none may appear in Sluice without tests of its own.
PYSPARK_PANDAS = re.compile(
    r"\.toPandas\(|createDataFrame\(|pandas_udf|mapInPandas|applyInPandas|"
    r"\.pandas_api\(|pyspark\.pandas|toLocalIterator\("
)
#: Where pyarrow hands Sluice's rows to pandas and back (each tested below).
PANDAS_BOUNDARIES = {
    "pipeline/jobs/replay/model.py": 2,  # the slice to the model, its results back
    "pipeline/jobs/bookmark.py": 1,  # a batch's rows to the predicates
    "pipeline/models/join.py": 2,  # the join model: frame to table and back
}


def sources() -> dict[str, str]:
    folders = ("pipeline", "assets", "resources", "collectors")
    return {
        str(p.relative_to(REPO)): p.read_text()
        for folder in folders
        for p in sorted((REPO / folder).rglob("*.py"))
    }


def test_no_data_crosses_through_pysparks_pandas_conversions():
    found = {path: PYSPARK_PANDAS.findall(text) for path, text in sources().items()}
    assert {path: hits for path, hits in found.items() if hits} == {}


def test_the_pandas_boundaries_are_the_audited_ones():
    counts = {
        path: len(re.findall(r"\.to_pandas\(|from_pandas\(", text))
        for path, text in sources().items()
    }
    assert {path: n for path, n in counts.items() if n} == PANDAS_BOUNDARIES


# --- Spark -> Arrow: the batch read (replays) and foreachBatch (bookmark, join, console) -----


@pytest.fixture
def varied(store) -> list:
    """Events whose payloads are not text, keys not ASCII, in two segments."""
    store.create_stream("t/varied", segments=2)
    with store.writer("t/varied") as writer:
        for i in range(40):
            payload = bytes([i, 0, 255, 10]) + "é€".encode() * i
            writer.write(payload, routing_key=f"clé-{i % 3}")
    return sorted(store.read("t/varied"), key=lambda e: (e.segment, e.offset))


def expected_rows(events) -> list[tuple]:
    return [
        (e.segment, e.offset, e.end_offset, e.routing_key, e.payload, e.ingest_time_ns // 1000)
        for e in events
    ]


def arrow_rows(table: pa.Table) -> list[tuple]:
    micros = table["ingest_time"].cast(pa.int64()).to_pylist()
    columns = [table[c].to_pylist() for c in ("segment", "offset", "end_offset", "routing_key")]
    rows = zip(*columns, table["payload"].to_pylist(), micros, strict=True)
    return sorted(rows)


def test_a_batch_read_reaches_the_driver_as_exact_arrow(spark, store_dir, varied):
    table = (
        spark.read.format("sluice")
        .option("store", f"embedded:{store_dir}")
        .option("stream", "t/varied")
        .load()
        .toArrow()
    )
    assert table.schema.field("ingest_time").type == pa.timestamp("us", tz="UTC")
    assert table.schema.field("payload").type == pa.binary()
    assert arrow_rows(table) == expected_rows(varied)


def test_foreach_batch_hands_exact_arrow_to_the_driver(spark, store_dir, varied, tmp_path):
    batches: list[pa.Table] = []
    query = (
        spark.readStream.format("sluice")
        .option("store", f"embedded:{store_dir}")
        .option("stream", "t/varied")
        .option("maxEventsPerTrigger", "15")
        .load()
        .writeStream.foreachBatch(lambda batch, _: batches.append(batch.toArrow()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert len(batches) >= 3
    assert arrow_rows(pa.concat_tables(batches)) == expected_rows(varied)


# --- Arrow -> pandas -> Arrow on the driver: the replay models -----------------------------


def echo(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """A replay model that returns the slice it was given, and the dtypes it saw."""
    return frame.copy(), {"dtypes": {c: str(t) for c, t in frame.dtypes.items()}}


@pytest.mark.parametrize("model", ["echo", "throughput"])
def test_a_replay_model_sees_and_returns_exact_values(spark, store, monkeypatch, model):
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")
    nic_stream(store, {"edge1": [[1000] * 10] * 4, "edge2": [[7] * 10] * 4})
    record = time_window_slice(store, STREAM, T0, T0 + 4 * SECOND)
    record_slices(store, [record])
    spec = f"{__name__}:echo" if model == "echo" else "pipeline.models.nic:throughput"
    result = replay(
        spark,
        store,
        record.slice_id,
        load_model(spec, {}),
        plan=flatten_plan("NetworkSamples"),
        home=sluice_home(),
    )
    written = pq.read_table(result.lineage.results_path)
    samples = sorted(
        (event["RemoteAddr"], t, rx)
        for e in store.read(STREAM)
        for event in [json.loads(e.payload)]
        for t, rx in zip(event["TimestampNanos"], event["RxBytes"], strict=True)
    )
    if model == "echo":
        dtypes = result.metrics["model_metrics"]["dtypes"]
        assert (dtypes["TimestampNanos"], dtypes["RxBytes"]) == ("int64", "int64")
        assert dtypes["RemoteAddr"] in ("str", "string", "object")  # pandas 3, 2
        assert written.schema.field("TimestampNanos").type == pa.int64()
        columns = [written[c].to_pylist() for c in ("RemoteAddr", "TimestampNanos", "RxBytes")]
        # nanoseconds past 2**53 survive the round trip through pandas
        assert sorted(zip(*columns, strict=True)) == samples
    else:
        assert written.schema.field("time").type == pa.timestamp("us", tz="UTC")
        assert sorted(set(written["RemoteAddr"].to_pylist())) == ["edge1", "edge2"]
        edge1 = written.filter(pa.compute.equal(written["RemoteAddr"], "edge1"))
        # 1000 B per sample, 10 samples per second; the very first sample has no delta
        assert edge1["rx_bytes"].to_pylist() == [9000, 10_000, 10_000, 10_000]
        micros = edge1["time"].cast(pa.int64()).to_pylist()
        assert micros == [(T0 + k * SECOND) // 1000 for k in range(4)]


def test_the_join_model_on_a_pandas_frame_matches_the_arrow_join():
    stamps = [T0 + k * 333_333_333 for k in range(12)]
    frame = pd.DataFrame(
        {
            "Interface": ["eth0", "wlan0", "eth0"] * 4,
            "TimestampNanos": stamps,
            "RxBytes": range(12),
        }
    )
    rows, metrics = join_model(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    left = table.filter(pa.compute.equal(table["Interface"], "eth0"))
    right = table.filter(pa.compute.equal(table["Interface"], "wlan0"))
    expected = join_tables(left, right, time_column="TimestampNanos").table
    assert metrics["pairs"] == expected.num_rows > 0
    assert rows["left_TimestampNanos"].tolist() == expected["left_TimestampNanos"].to_pylist()
    assert rows["right_TimestampNanos"].dtype == "int64"
    assert rows["left_Interface"].tolist() == ["eth0"] * expected.num_rows
