"""Replay identity: slice, model, code version and parameters name a replay's files, so an
identical replay replaces its own bytes and nothing else ever overwrites them; empty slices."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.replay import (
    BadLineageRecord,
    LineageRecord,
    ModelError,
    OutputInUse,
    ReplayKey,
    hash_params_text,
    load_model,
    replay,
)
from pipeline.jobs.slices import record_slices, time_window_slice
from pipeline.schemas import flatten_plan
from tests.jobs.test_replay_support import STREAM, T0, nic_stream

SECOND = 1_000_000_000
NIC = "pipeline.models.nic:throughput"
BURSTY = [[100] * 10, [20_000] * 10, [100] * 10, [20_000] * 10, [100] * 10]


@pytest.fixture(autouse=True)
def _no_sluice_toml(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")


@pytest.fixture
def bursty(store):
    nic_stream(store, {"edge1": BURSTY})
    record = time_window_slice(store, STREAM, T0, T0 + 5 * SECOND, sensor="edge1")
    record_slices(store, [record])
    return record


def _replay(spark, store, record, spec=NIC, output_dir=None, **params):
    return replay(
        spark,
        store,
        record.slice_id,
        load_model(spec, params),
        plan=flatten_plan("NetworkSamples"),
        home=sluice_home(),
        output_dir=output_dir,
    )


def _bytes(result) -> tuple[bytes, bytes]:
    lineage = result.lineage
    return Path(lineage.results_path).read_bytes(), Path(lineage.metrics_path).read_bytes()


def test_different_parameters_keep_two_results_and_two_lineage_records(spark, store, bursty):
    first = _replay(spark, store, bursty, burst_mbps=1.0, idle_mbps=0.01)
    first_bytes = _bytes(first)
    second = _replay(spark, store, bursty)  # the defaults: burst_mbps=50, idle_mbps=0.1
    a, b = first.lineage, second.lineage
    assert a.run_id != b.run_id and a.params_hash != b.params_hash
    assert a.output_dir != b.output_dir and a.results_path != b.results_path
    assert _bytes(first) == first_bytes  # the second replay left the first's files alone
    stored = sorted(p.name for p in (sluice_home() / "lineage").glob("*.json"))
    assert stored == sorted([f"{a.run_id}.json", f"{b.run_id}.json"])
    assert pq.read_table(a.results_path)["state"].to_pylist().count("burst") == 2
    assert "burst" not in pq.read_table(b.results_path)["state"].to_pylist()
    # the parameters and their hash, in full, in the lineage record and the metrics
    assert json.loads(a.params) == {"burst_mbps": 1.0, "idle_mbps": 0.01}
    assert json.loads(b.params) == {"burst_mbps": 50.0, "idle_mbps": 0.1}
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", a.params_hash)
    assert a.params_hash == hash_params_text(a.params)
    assert json.loads(Path(a.metrics_path).read_text())["params_hash"] == a.params_hash
    # the layout: replays/<slice>/<module.function>@<version>/params-<hash16>/
    key = ReplayKey(bursty.slice_id, NIC, a.model_version, a.params_hash)
    assert Path(a.output_dir) == key.directory(sluice_home()) and key.run_id == a.run_id
    assert Path(a.output_dir).name == "params-" + a.params_hash[7:23]


def test_an_identical_replay_is_the_same_run_with_the_same_bytes(spark, store, bursty):
    first = _replay(spark, store, bursty, burst_mbps=1.0)
    first_bytes = _bytes(first)
    # the defaults spelled out are the same parameters: the same replay
    again = _replay(spark, store, bursty, burst_mbps=1.0, idle_mbps=0.1)
    assert again.lineage.run_id == first.lineage.run_id
    assert _bytes(again) == first_bytes
    assert len(list((sluice_home() / "lineage").glob("*.json"))) == 1


def test_an_output_directory_of_another_replay_is_refused(spark, store, bursty, tmp_path):
    out = tmp_path / "mine"
    first = _replay(spark, store, bursty, output_dir=out, burst_mbps=1.0)
    before = _bytes(first)
    other = load_model(NIC, {"burst_mbps": 2.0})
    expected = f"{out} holds the files of replay {first.lineage.run_id}, not of this one"
    with pytest.raises(OutputInUse, match=re.escape(expected)):
        _replay(spark, store, bursty, output_dir=out, burst_mbps=2.0)
    assert _bytes(first) == before
    assert ReplayKey.of(bursty.slice_id, other).run_id != first.lineage.run_id


@pytest.mark.spark
@pytest.mark.parametrize("spelled", ["not-yet/../mine", "link"])
def test_another_replay_s_directory_spelled_otherwise_is_refused(
    spark, store, bursty, tmp_path, spelled
):
    """Through `..` whose first part does not exist yet (unresolved, `mine/lineage.json` is
    not found there) or a symbolic link: before, the other replay's results replaced the
    first's, and the first's lineage record pointed at them."""
    out = tmp_path / "mine"
    first = _replay(spark, store, bursty, output_dir=out, burst_mbps=1.0)
    before = _bytes(first)
    (tmp_path / "link").symlink_to(out)
    with pytest.raises(
        OutputInUse, match=re.escape(f"holds the files of replay {first.lineage.run_id}")
    ):
        _replay(spark, store, bursty, output_dir=tmp_path / spelled, burst_mbps=2.0)
    assert _bytes(first) == before
    assert json.loads((out / "lineage.json").read_text())["run_id"] == first.lineage.run_id
    assert [p.name for p in (sluice_home() / "lineage").glob("*.json")] == [
        f"{first.lineage.run_id}.json"
    ]


def test_unknown_parameters_are_refused_before_anything_runs():
    with pytest.raises(ModelError, match=re.escape("do not fit it")):
        load_model(NIC, {"burst_mpbs": 5})
    assert load_model(NIC, {}).params == {"burst_mbps": 50.0, "idle_mbps": 0.1}


def test_an_empty_slice_replays_to_an_empty_result_with_metrics(spark, store, bursty):
    later = T0 + 3600 * SECOND
    empty = time_window_slice(store, STREAM, later, later + SECOND)
    record_slices(store, [empty])
    result = _replay(spark, store, empty)
    assert result.results.num_rows == 0
    assert result.results.schema.names == [
        "RemoteAddr",
        "Interface",
        "time",
        "samples",
        "rx_bytes",
        "tx_bytes",
        "rx_mbps",
        "tx_mbps",
        "state",
    ]
    metrics = json.loads(Path(result.lineage.metrics_path).read_text())
    assert (metrics["input_events"], metrics["input_rows"], metrics["output_rows"]) == (0, 0, 0)
    assert metrics["model_metrics"]["seconds"] == 0
    assert pq.read_table(result.lineage.results_path).num_rows == 0


def test_lineage_records_of_version_1_are_read_and_others_refused(tmp_path):
    v1 = {
        "run_id": "rp-old",
        "slice_id": "sl-1",
        "stream": STREAM,
        "sensor": None,
        "start_cut": "v1~examples~network~0-0",
        "end_cut": "v1~examples~network~0-10",
        "start_time_ns": 1,
        "end_time_ns": 2,
        "input_events": 1,
        "input_rows": 1,
        "output_rows": 1,
        "model": NIC,
        "model_version": "sha256:abc",
        "output_dir": "/x",
        "results_path": "/x/results.parquet",
        "metrics_path": "/x/metrics.json",
        "started_at": "2026-11-01T00:00:00.000Z",
        "finished_at": "2026-11-01T00:00:01.000Z",
        "quarantined_events": 0,
        "params": '{"burst_mbps": 5.0}',
        "version": 1,
    }
    path = tmp_path / "rp-old.json"
    path.write_text(json.dumps(v1))
    record = LineageRecord.read(path)
    assert record.version == 1
    assert record.params_hash == hash_params_text('{"burst_mbps": 5.0}')
    path.write_text(json.dumps({**v1, "version": 9}))
    with pytest.raises(BadLineageRecord, match=re.escape("version 9; this Sluice reads 1, 2")):
        LineageRecord.read(path)


@pytest.mark.usefixtures("spark")
def test_replay_compare_keeps_both_sides(store, store_dir, bursty, capsys):
    argv = ["--store", f"embedded:{store_dir}", "replay", "compare", bursty.slice_id]
    argv += ["--schema", "NetworkSamples", "--model", f"{NIC},burst_mbps=1"]
    assert cli.main([*argv, "--model", f"{NIC},burst_mbps=100", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    a, b = report["a"], report["b"]
    assert a["params"]["burst_mbps"] == 1 and b["params"]["burst_mbps"] == 100
    assert a["results"] != b["results"]
    states_a = pq.read_table(a["results"])["state"].to_pylist()
    states_b = pq.read_table(b["results"])["state"].to_pylist()
    assert "burst" in states_a and "burst" not in states_b
    assert {p.stem for p in (sluice_home() / "lineage").glob("*.json")} == {a["run"], b["run"]}


def test_equal_values_are_one_identity_of_the_values_the_model_gets():
    """`995` for a float parameter is `995.0`: one run id, one directory. The identity is of
    the values the model receives, so values already of the right type keep theirs."""
    from pipeline.cli.replay import parse_model_option

    spec, params = parse_model_option(f"{NIC},burst_mbps=995")
    as_int, as_float = load_model(spec, params), load_model(NIC, {"burst_mbps": 995.0})
    assert as_int.params == {"burst_mbps": 995.0, "idle_mbps": 0.1}
    assert isinstance(as_int.params["burst_mbps"], float)
    assert as_int.params_hash == as_float.params_hash
    assert ReplayKey.of("sl-1", as_int).run_id == ReplayKey.of("sl-1", as_float).run_id
    assert as_float.params_text == '{"burst_mbps": 995.0, "idle_mbps": 0.1}'
    assert load_model(NIC).params_hash == hash_params_text('{"burst_mbps": 50.0, "idle_mbps": 0.1}')


@pytest.fixture
def typed_model(tmp_path, monkeypatch):
    (tmp_path / "typed_model.py").write_text(
        "def typed(frame, n: int = 3, name: str = 'a', flag: bool = False,\n"
        "          gap: float | None = None, tags=(), **extra):\n"
        "    return frame\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "typed_model:typed"


def test_each_parameter_takes_the_type_of_its_default(typed_model):
    model = load_model(typed_model, {"n": 4.0, "name": 123, "gap": 5, "tags": [1], "x": 1})
    assert model.params == {
        "n": 4,
        "name": "123",
        "flag": False,
        "gap": 5.0,
        "tags": [1],
        "x": 1,
    }
    assert load_model(typed_model, {"gap": None}).params["gap"] is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n": 3.5}, "parameter n=3.5 is not a whole number (its default is 3)"),
        ({"n": "three"}, "parameter n='three' is not a whole number (its default is 3)"),
        ({"flag": 1}, "parameter flag=1 is not true or false (its default is False)"),
        ({"n": True}, "parameter n=True is not a whole number (its default is 3)"),
        ({"gap": "x"}, "parameter gap='x' is not a number or null (its default is None)"),
        ({"name": 1.5}, "parameter name=1.5 is not text (its default is 'a')"),
    ],
)
def test_a_value_that_does_not_fit_the_type_is_refused(typed_model, params, message):
    with pytest.raises(ModelError, match=re.escape(f"model {typed_model}: {message}")):
        load_model(typed_model, params)
