"""What `sluice slices create` and `sluice replay` refuse before Spark starts: a slice whose
sensor is named by columns the stream's rows lack, and a number of --model options the
command does not take. Each is one line, `sluice: error: ...`, exit 1, no traceback."""

from __future__ import annotations

import pickle
import re

import pyarrow as pa
import pytest

from pipeline import cli
from pipeline.jobs.replay import SliceSensorUnknown, check_sensor_by
from pipeline.jobs.slices import list_slices, record_slices, time_window_slice
from pipeline.schemas import flatten_plan
from pipeline.schemas.sensors import UnknownSensorColumns, sensor_names
from tests.jobs.test_replay_support import STREAM, T0, nic_stream

SECOND = 1_000_000_000
NIC = "pipeline.models.nic:throughput"
COLUMNS = "RemoteAddr, Interface, TimestampNanos, RxBytes, TxBytes, _segment, _offset, _sample"
WINDOW = ["--from", "2026-11-01T10:00Z", "--to", "2026-11-01T10:01Z"]


@pytest.fixture
def no_config(monkeypatch):
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")


@pytest.fixture
def network_config(tmp_path, monkeypatch):
    """A sluice.toml that names the schema of `examples/network`."""
    config = tmp_path / "sluice.toml"
    config.write_text(
        f'[streams.network]\nstream = "{STREAM}"\nschema = "NetworkSamples"\n'
        '[streams.network.mirror]\nstream = "cloud/network"\n'
        '[stores.cloud]\nembedded = "cloud-streams"\n'
    )
    monkeypatch.setenv("SLUICE_CONFIG", str(config))


def refused(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]  # after a progress line ("replay: finding slice")


# --- --sensor-by columns ---------------------------------------------------------------------


def test_a_slice_by_an_unknown_column_is_refused_at_replay_before_spark(
    store, store_dir, capsys, no_config, _sluice_home
):
    """The slice names no schema: `slices create` cannot know the columns (sluice.toml
    names none for the stream), so the replay refuses it, naming the column and the columns
    the rows have (it died in every Spark task with `KeyError: 'Nope'`)."""
    nic_stream(store, {"edge1": [[1, 2]]})
    base = ["--store", f"embedded:{store_dir}"]
    create = [*base, "slices", "create", STREAM, *WINDOW, "--sensor", "edge1", "--sensor-by"]
    assert cli.main([*create, "Nope"]) == 0
    (record,) = list_slices(store, STREAM)
    replay = [*base, "replay", record.slice_id, "--model", NIC, "--schema", "NetworkSamples"]
    assert refused(capsys, replay) == (
        f"sluice: error: slice {record.slice_id} names its sensor by 'Nope', but the rows of "
        f"NetworkSamples have no column 'Nope' (their columns: {COLUMNS}): record the slice "
        "again with --sensor-by naming columns of the schema (or routing_key), or replay it "
        "with the --schema it was made for"
    )
    assert not (_sluice_home / "replays").exists()
    assert not (_sluice_home / "lineage").exists()


def test_a_slice_by_an_unknown_column_is_refused_at_create_when_the_schema_is_known(
    store, store_dir, capsys, network_config
):
    nic_stream(store, {"edge1": [[1, 2]]})
    base = ["--store", f"embedded:{store_dir}", "slices", "create", STREAM, *WINDOW]
    argv = [*base, "--sensor", "edge1", "--sensor-by", "RemoteAddr, Nope"]
    assert refused(capsys, argv) == (
        "sluice: error: --sensor-by 'RemoteAddr, Nope': the rows of NetworkSamples have no "
        f"column 'Nope' (their columns: {COLUMNS}): name columns of the schema, "
        "comma-separated, or routing_key"
    )
    assert list_slices(store, STREAM) == []
    good = [*base, "--sensor", "edge1/eth0", "--sensor-by", "RemoteAddr,Interface"]
    assert cli.main(good) == 0, capsys.readouterr().err
    assert [r.sensor_by for r in list_slices(store, STREAM)] == ["RemoteAddr,Interface"]


def test_check_sensor_by_passes_slices_by_key_and_by_known_columns(store):
    nic_stream(store, {"edge1": [[1]]})
    plan = flatten_plan("NetworkSamples")
    for sensor, by in ((None, "Nope"), ("edge1", "routing_key"), ("edge1/eth0", "RemoteAddr")):
        check_sensor_by(
            time_window_slice(store, STREAM, T0, T0 + SECOND, sensor=sensor, sensor_by=by), plan
        )
    record = time_window_slice(store, STREAM, T0, T0 + SECOND, sensor="x", sensor_by="Nope,Oops")
    record_slices(store, [record])
    with pytest.raises(SliceSensorUnknown, match=re.escape("no column 'Nope', 'Oops' (their")):
        check_sensor_by(record, plan)


def test_sensor_names_of_a_missing_column_is_a_typed_error_that_survives_pickling():
    """What a Spark task raises, should a replay reach one: shown as its message."""
    rows = pa.table({"host": ["a"], "port": [1]})
    with pytest.raises(UnknownSensorColumns) as raised:
        sensor_names(rows, "host,Nope")
    said = "--sensor-by 'host,Nope': the rows have no column 'Nope' (their columns: host, port)"
    assert str(raised.value).startswith(said)
    assert isinstance(raised.value, KeyError)
    again = pickle.loads(pickle.dumps(raised.value))
    assert (str(again), again.missing, again.columns) == (
        str(raised.value),
        ["Nope"],
        ["host", "port"],
    )


# --- the number of --model options -----------------------------------------------------------


@pytest.mark.parametrize(
    ("words", "models", "said"),
    [
        (
            ["sl-1"],
            ["a:b", "c:d"],
            "sluice replay takes one --model (got 2 --model options); to compare two models: "
            "sluice replay compare sl-1 --model A --model B",
        ),
        (
            ["compare", "sl-1"],
            ["a:b"],
            "sluice replay compare takes two --model options, one per side (got 1 --model option)",
        ),
        (
            ["compare", "sl-1"],
            ["a:b", "c:d", "e:f"],
            "sluice replay compare takes two --model options, one per side (got 3 --model options)",
        ),
    ],
)
def test_a_wrong_number_of_models_blames_no_model(capsys, no_config, words, models, said):
    """It said `model a:b: give one --model`, as if a:b were at fault (and, for models that
    do not import, complained of the first one's import instead)."""
    argv = ["replay", *words]
    for model in models:
        argv += ["--model", model]
    assert refused(capsys, argv) == f"sluice: error: {said}"
