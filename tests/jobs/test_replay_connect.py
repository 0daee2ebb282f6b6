"""A replay attached to a Spark Connect server (on loopback) writes the reference's files.

The tasks run in the server's Python workers; the rows come back through the spool directory
(the server's executors are on this machine). The files must be those of the former
driver-side read (`test_replay_read._reference`), byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.jobs.replay import load_model, run_model
from pipeline.jobs.slices import SliceRecord, record_slices
from pipeline.schemas import flatten_plan
from pipeline.streams import open_store
from tests.jobs.test_replay_read import INSIDE, _reference
from tests.jobs.test_replay_support import STREAM, nic_stream
from tests.spark.killing import run_to_completion
from tests.spark.test_connect import server  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_a_replay_through_spark_connect_writes_the_reference_files(tmp_path, server):  # noqa: F811
    home, env, _state = server
    uri = f"embedded:{tmp_path / 'cloud'}"
    with open_store(uri) as store:
        nic_stream(store, {"edge1": [[100 + i for i in range(10)]] * 6, "edge2": [[7] * 10] * 6})
        record = SliceRecord.create(
            stream=STREAM,
            sensor="edge1",
            start_cut=store.head(STREAM),
            end_cut=store.tail(STREAM),
            start_time_ns=INSIDE[0],
            end_time_ns=INSIDE[1],
            reason="test",
            created_by="test",
        )
        record_slices(store, [record])
    out = tmp_path / "replay"
    argv = ["-v", "--store", uri, "replay", record.slice_id, "--schema", "NetworkSamples"]
    argv += ["--model", "pipeline.models.nic:throughput", "--output", str(out)]
    life = run_to_completion(argv, env)
    assert "attaching to Spark Connect" in "".join(life.stderr), life.tail()
    with open_store(uri) as store:
        rows, _, between = _reference(store, record, flatten_plan("NetworkSamples"))
    model = load_model("pipeline.models.nic:throughput")
    results, model_metrics = run_model(model, rows.to_pandas())
    pq.write_table(results, tmp_path / "expected.parquet", compression="zstd")
    assert (out / "results.parquet").read_bytes() == (tmp_path / "expected.parquet").read_bytes()
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["input_events"], metrics["input_rows"]) == (between, rows.num_rows) != (0, 0)
    assert metrics["model_metrics"] == json.loads(json.dumps(model_metrics))
    assert not (Path(home) / "spool").exists()
