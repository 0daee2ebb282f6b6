"""Replays: a bounded Spark read of exactly a slice, a model, byte-identical results, lineage."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, fields

import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.replay import (
    LineageRecord,
    ModelError,
    SliceTruncated,
    compare,
    load_model,
    replay,
)
from pipeline.jobs.slices import record_slices, time_window_slice
from pipeline.schemas import flatten_plan
from tests.jobs.test_replay_support import STREAM, T0, nic_stream, write_event

pytestmark = pytest.mark.spark
SECOND = 1_000_000_000
BURSTY = [[100] * 10, [20_000] * 10, [100] * 10, [20_000] * 10, [100] * 10]


@pytest.fixture(scope="module")
def spark():
    from pipeline.spark.session import SparkSettings, spark_session

    return spark_session(SparkSettings(master="local[2]"))


@pytest.fixture(autouse=True)
def _no_sluice_toml(tmp_path, monkeypatch):
    """The schema of a stream comes from sluice.toml: use none unless a test writes one."""
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")


@pytest.fixture
def network(store):
    """Two NICs, five one-second events each; edge1 bursts in seconds 1 and 3; one malformed
    edge1 event at 1.5 s."""
    written = nic_stream(store, {"edge1": BURSTY, "edge2": [[5] * 10] * 5})
    bad = (
        b'{"RemoteAddr":"edge1","Interface":"eth0","TimestampNanos":[1],"RxBytes":[],"TxBytes":[]}'
    )
    write_event(store, "edge1", bad, (T0 + 1_500_000_000, T0 + 1_500_000_000))
    record = time_window_slice(store, STREAM, T0 + SECOND, T0 + 4 * SECOND, sensor="edge1")
    record_slices(store, [record])
    return record, written


def _replay(spark, store, record, spec="pipeline.models.nic:throughput", **params):
    model = load_model(spec, params)
    return replay(
        spark,
        store,
        record.slice_id,
        model,
        plan=flatten_plan("NetworkSamples"),
        home=sluice_home(),
    )


def test_same_slice_same_model_gives_byte_identical_results(spark, store, network):
    record, _ = network
    first = _replay(spark, store, record, burst_mbps=1.0)
    out = first.lineage
    results = pq.read_table(out.results_path)
    bytes_1 = (open(out.results_path, "rb").read(), open(out.metrics_path, "rb").read())
    second = _replay(spark, store, record, burst_mbps=1.0)
    assert second.lineage.results_path == out.results_path
    bytes_2 = (open(out.results_path, "rb").read(), open(out.metrics_path, "rb").read())
    assert bytes_1 == bytes_2
    # exactly the slice: edge1's samples of seconds 1, 2 and 3, nothing of edge2
    seconds = [t.timestamp() for t in results["time"].to_pylist()]
    assert seconds == [(T0 // SECOND) + k for k in (1, 2, 3)]
    assert str(results.schema.field("time").type) == "timestamp[us, tz=UTC]"
    assert results["state"].to_pylist() == ["burst", "idle", "burst"]
    assert first.metrics["input_rows"] == 30
    assert first.metrics["quarantined_events"] == 1
    assert first.metrics["model_metrics"]["burst_periods"] == 2


def test_lineage_is_complete_and_stored_under_the_home(spark, store, network):
    record, _ = network
    result = _replay(spark, store, record)
    lineage = result.lineage
    stored = json.loads((sluice_home() / "lineage" / f"{lineage.run_id}.json").read_text())
    assert stored == asdict(lineage)
    assert {f.name for f in fields(LineageRecord)} <= stored.keys()
    assert (lineage.slice_id, lineage.stream, lineage.sensor) == (record.slice_id, STREAM, "edge1")
    assert (lineage.start_cut, lineage.end_cut) == (record.start_cut, record.end_cut)
    events_between = len(list(store.read(STREAM, *record.cuts)))
    assert lineage.input_events == events_between
    assert (lineage.input_rows, lineage.output_rows) == (30, 3)
    assert lineage.model == "pipeline.models.nic:throughput"
    assert lineage.model_version == load_model(lineage.model).version
    assert lineage.model_version.startswith("sha256:")
    assert lineage.started_at <= lineage.finished_at
    assert json.loads(open(lineage.metrics_path).read())["output_rows"] == 3


def test_compare_shows_metric_and_row_differences(spark, store, network):
    record, _ = network
    old = _replay(spark, store, record, burst_mbps=1.0)
    new = _replay(spark, store, record, burst_mbps=100.0)
    report = compare(old, new)
    assert not report.identical
    metrics = {name: (a, b) for name, a, b in report.metrics}
    assert metrics["model_metrics.burst_seconds"] == (2, 0)
    assert metrics["input_rows"] == (30, 30)
    assert (report.only_a, report.only_b) == (2, 2)
    assert {r["state"] for r in report.sample_a} == {"burst"}
    assert {r["state"] for r in report.sample_b} == {"active"}
    assert compare(old, _replay(spark, store, record, burst_mbps=1.0)).identical


def test_a_slice_truncated_past_its_start_is_refused(spark, store, network):
    record, _ = network
    start, _ = record.cuts
    store.truncate(store.tail(STREAM))
    expected = f"slice {record.slice_id} cannot be replayed: {STREAM} segment"
    with pytest.raises(SliceTruncated, match=re.escape(expected)):
        _replay(spark, store, record)
    assert not (sluice_home() / "replays").exists()
    assert start.positions  # the slice itself still names its cuts


def test_the_join_as_a_model(spark, store):
    nic_stream(store, {"edge1": [[1] * 10] * 3, "edge2": [[2] * 10] * 3})
    record = time_window_slice(store, STREAM, T0, T0 + 3 * SECOND)
    record_slices(store, [record])
    result = _replay(
        spark,
        store,
        record,
        "pipeline.models.join:join",
        split_column="RemoteAddr",
        left="edge1",
        right="edge2",
    )
    # equal timestamps on both NICs: each sample pairs once with its twin, 30 pairs
    assert result.metrics["model_metrics"]["pairs"] == 30
    rows = result.results.to_pylist()
    assert all(r["left_TimestampNanos"] == r["right_TimestampNanos"] for r in rows)


@pytest.mark.usefixtures("spark")
def test_sluice_replay_and_compare_commands(store, store_dir, network, monkeypatch, capsys):
    record, _ = network
    base = ["--store", f"embedded:{store_dir}", "replay"]
    model = "pipeline.models.nic:throughput,burst_mbps=1"
    out_dir = sluice_home() / "my-replay"
    argv = [*base, record.slice_id, "--model", model, "--schema", "NetworkSamples"]
    assert cli.main([*argv, "--output", "my-replay"]) == 0  # relative: under the home
    summary = json.loads(capsys.readouterr().out)
    assert summary["results"] == str(out_dir / "results.parquet")
    assert summary["output_rows"] == 3
    compare_argv = [*base, "compare", record.slice_id, "--schema", "NetworkSamples"]
    assert cli.main([*compare_argv, "--model", model, "--model", f"{model}00", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows_only_in_a"] == 2 and report["identical"] is False
    assert cli.main([*compare_argv, "--model", model, "--model", f"{model}00"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == f"slice {record.slice_id}"
    assert table[1].startswith("a: pipeline.models.nic:throughput@")
    assert '"burst_mbps": 1.0,' in table[1] and '"burst_mbps": 100.0,' in table[2]
    rows_line = f"rows only in a: 2, only in b: {report['rows_only_in_b']}"
    assert rows_line in table
    metric_rows = [line for line in table if line.startswith("model_metrics.")]
    assert metric_rows, table  # the metrics that differ, one row each
    assert len(table) < 40
    assert cli.main([*base, record.slice_id, "--model", model]) == 1
    assert "no Avro schema is known for examples/network" in capsys.readouterr().err
    config = sluice_home() / "sluice.toml"
    config.write_text(
        '[streams.network]\nstream = "examples/network"\nschema = "NetworkSamples"\n'
        '[streams.network.mirror]\nstream = "cloud/network"\nstore = "edge"\n'
    )
    monkeypatch.setenv("SLUICE_CONFIG", str(config))
    assert cli.main([*base, record.slice_id, "--model", model]) == 0
    assert json.loads(capsys.readouterr().out)["output_rows"] == 3


def test_models_are_named_module_colon_function():
    with pytest.raises(ModelError, match=re.escape("name it as module:function")):
        load_model("pipeline.models.nic")
    with pytest.raises(ModelError, match=re.escape("has no function 'nope'")):
        load_model("pipeline.models.nic:nope")
    with pytest.raises(ModelError, match="cannot import no_such_module"):
        load_model("no_such_module:f")
