"""A model that misbehaves (does not import, raises, returns what a replay cannot keep) is a
`ModelError` naming it, with the model's own traceback and none of Sluice's; it leaves no
results or lineage, and a re-run of the fixed model replays the slice."""

from __future__ import annotations

import json
import re
import sys

import pandas as pd
import pyarrow as pa
import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.replay import ModelError, load_model, run_model
from pipeline.jobs.slices import record_slices, time_window_slice
from tests.jobs.test_replay_support import STREAM, T0, nic_stream

SECOND = 1_000_000_000
ROWS = pd.DataFrame({"Value": [1.0, 2.0, 3.0]})

MODELS = """
import sys

import numpy as np
import pandas as pd
import pyarrow as pa


def no_rows():
    return pd.DataFrame()


def raises(frame, threshold: float = 1.0):
    return helper(frame)


def helper(frame):
    raise ValueError("no column Speed")


def exits(frame):
    sys.exit(3)


def prints(frame):
    print("hello from the model")
    return frame, {"rows": np.int64(len(frame)), "mean": np.float32(0.5)}


def not_finite(frame):
    return frame, {"rmse": float("nan"), "worst": [1.0, np.float64("inf")], "ok": 2.5}


def returns(frame, what: str = ""):
    return {
        "mixed": pd.DataFrame({"x": [1, "a"]}),
        "repeated": pd.DataFrame([[1, 2]], columns=["a", "a"]),
        "no columns": pd.DataFrame(),
        "view columns": pa.table({"model": ["m"], "run_id": ["r"], "x": [1]}),
        "three": (frame, {}, 1),
        "not JSON": (frame, {"when": pd.Timestamp("2020-01-01")}),
        "time in ns": pd.DataFrame({"time": [1_700_000_000_000_000_000], "x": [1]}),
    }[what]
"""


@pytest.fixture
def models(tmp_path, monkeypatch):
    """A module of misbehaving models, and modules that fail to import, on the path."""
    (tmp_path / "misbehaving.py").write_text(MODELS)
    (tmp_path / "broken_syntax.py").write_text("def model(frame:\n    return frame\n")
    (tmp_path / "raises_on_import.py").write_text('raise RuntimeError("no licence file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_module_that_fails_to_import_names_its_line(models):
    with pytest.raises(ModelError) as error:
        load_model("broken_syntax:model")
    first, *trace = str(error.value).splitlines()
    assert first == (
        "model broken_syntax:model: importing broken_syntax raised SyntaxError: "
        "'(' was never closed (broken_syntax.py, line 1)"
    )
    assert f'File "{models / "broken_syntax.py"}", line 1' in trace[0]
    message = "importing raises_on_import raised RuntimeError: no licence file"
    with pytest.raises(ModelError, match=re.escape(message)) as error:
        load_model("raises_on_import:model")
    assert "pipeline" not in error.value.trace and "importlib" not in error.value.trace
    assert 'raises_on_import.py", line 1, in <module>' in error.value.trace


def test_a_function_without_an_argument_for_the_rows_is_refused(models):
    reason = "takes no argument for the slice's rows: a model is function(frame, **params)"
    with pytest.raises(ModelError, match=re.escape(f"model misbehaving:no_rows: {reason}")):
        load_model("misbehaving:no_rows")


def test_a_model_that_raises_shows_its_own_traceback_only(models):
    model = load_model("misbehaving:raises")
    with pytest.raises(ModelError) as error:
        run_model(model, pa.Table.from_pandas(ROWS))
    first, *trace = str(error.value).splitlines()
    assert first == "model misbehaving:raises: raised ValueError: no column Speed"
    assert trace[0] == "Traceback (most recent call last):"
    assert [line.split(", in ")[-1] for line in trace if ", in " in line] == ["raises", "helper"]
    assert "pipeline" not in error.value.trace
    with pytest.raises(ModelError, match=re.escape("raised SystemExit: 3")):
        run_model(load_model("misbehaving:exits"), ROWS)


@pytest.mark.parametrize(
    ("what", "message"),
    [
        ("mixed", "its results cannot be written as Parquet (Could not convert 'a' with type str"),
        ("repeated", "Duplicate column names found: ['a', 'a']): give each column one type"),
        ("no columns", "returned a table without columns: an empty result is its columns"),
        ("view columns", "its results have columns ['model', 'run_id'], which are repeated"),
        ("three", "must return a pandas DataFrame or pyarrow Table, or (that, dict), not (tuple"),
        ("not JSON", "its metrics hold a value that is not JSON (a Timestamp: Timestamp("),
        ("time in ns", "its `time` column holds int64, not timestamps: the `replays` view"),
    ],
)
def test_results_a_replay_cannot_keep_are_refused(models, what, message):
    model = load_model("misbehaving:returns", {"what": what})
    with pytest.raises(ModelError, match=re.escape(message)) as error:
        run_model(model, ROWS)
    assert str(error.value).startswith("model misbehaving:returns: ")
    assert "\n" not in str(error.value)


def test_prints_go_to_stderr_and_numpy_metrics_are_numbers(models, capsys):
    results, metrics = run_model(load_model("misbehaving:prints"), ROWS)
    assert results.num_rows == 3
    assert metrics == {"rows": 3, "mean": 0.5} and type(metrics["rows"]) is int
    out, err = capsys.readouterr()
    assert out == "" and err == "hello from the model\n"


def test_metrics_json_has_no_nan_or_infinity(models, capsys):
    """JSON has neither: a NaN metric (a mean of no rows) is kept as null, and said so."""
    _, metrics = run_model(load_model("misbehaving:not_finite"), ROWS)
    assert metrics == {"rmse": None, "worst": [1.0, None], "ok": 2.5}
    json.dumps(metrics, allow_nan=False)  # strict JSON readers take it
    err = capsys.readouterr().err
    assert "metrics kept as null (JSON has no NaN or infinity): rmse (nan), worst[1] (inf)" in err


@pytest.mark.spark
@pytest.mark.usefixtures("spark")
def test_a_failed_replay_writes_nothing_and_a_fixed_model_replays(
    store, store_dir, models, monkeypatch, capsys
):
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")
    nic_stream(store, {"edge1": [[100] * 10] * 3})
    record = time_window_slice(store, STREAM, T0, T0 + 3 * SECOND, sensor="edge1")
    record_slices(store, [record])
    argv = ["-q", "--store", f"embedded:{store_dir}", "replay", record.slice_id]
    argv += ["--schema", "NetworkSamples", "--model"]
    assert cli.main([*argv, "misbehaving:raises"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines()[0] == (
        "sluice: error: model misbehaving:raises: raised ValueError: no column Speed"
    )
    assert "pipeline/" not in err
    assert not (sluice_home() / "replays").exists() and not (sluice_home() / "lineage").exists()
    fixed = MODELS.replace('raise ValueError("no column Speed")', "return frame[['RxBytes']]")
    (models / "misbehaving.py").write_text(fixed + "\nprint('loaded')\n")
    monkeypatch.delitem(sys.modules, "misbehaving")
    assert cli.main([*argv, "misbehaving:raises"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["output_rows"] == 30
    assert err.count("loaded") == 1 and len(list((sluice_home() / "lineage").iterdir())) == 1
