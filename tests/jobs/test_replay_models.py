"""The NIC model's numpy path gives exactly the rows of its pandas definition, from a DataFrame
or from Arrow (plain or dictionary-encoded text), and a replay hands Arrow to a model that
takes it, a DataFrame to any other, and the DataFrame when an Arrow model declines the table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from pipeline.jobs.replay import load_model, run_model, takes_arrow
from pipeline.models import nic

NS = 1_000_000_000


def samples(nics: int, rows: int = 4000, seed: int = 5) -> pd.DataFrame:
    """`rows` samples over `nics` NICs, out of time order, with equal times within a NIC,
    counters that go backwards now and then, and times before the epoch."""
    rng = np.random.default_rng(seed)
    hosts = rng.integers(0, max(1, nics // 2 + 1), rows)
    interfaces = rng.integers(0, 2, rows)
    nic_of = (hosts * 2 + interfaces) % max(nics, 1)
    times = rng.integers(-3 * NS, 20 * NS, rows) // 1_000_000 * 1_000_000
    counters = rng.integers(0, 1 << 40, rows)
    return pd.DataFrame(
        {
            "RemoteAddr": [f"host-{n // 2:03d}" for n in nic_of],
            "Interface": [f"eth{n % 2}" for n in nic_of],
            "TimestampNanos": times,
            "RxBytes": counters,
            "TxBytes": counters // 3,
        }
    )


def as_dictionary(table: pa.Table) -> pa.Table:
    """The text columns dictionary-encoded over one indices array (row numbers into a
    dictionary that repeats values), as a replay's merge gives per-event columns."""
    indices = pa.array(np.arange(table.num_rows, dtype=np.int64))
    for name in nic.NIC:
        column = pa.DictionaryArray.from_arrays(indices, table.column(name).combine_chunks())
        table = table.set_column(table.schema.get_field_index(name), name, column)
    return table


@pytest.mark.parametrize("nics", [1, 3, 40])
def test_the_numpy_path_gives_the_rows_of_the_definition(nics):
    frame = samples(nics)
    expected = nic._per_second_frame(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    for data in (frame, table, as_dictionary(table)):
        got = nic._per_second(data)
        pd.testing.assert_frame_equal(got, expected, check_exact=True)


def test_throughput_is_the_same_from_pandas_and_from_arrow():
    frame = samples(4)
    table = as_dictionary(pa.Table.from_pandas(frame, preserve_index=False))
    model = load_model("pipeline.models.nic:throughput", {"burst_mbps": 1e6})
    assert takes_arrow(model)
    from_frame, from_table = run_model(model, frame), run_model(model, table)
    assert from_frame[0].equals(from_table[0]) and from_frame[1] == from_table[1]
    assert from_table[0].schema.field("RemoteAddr").type == pa.large_string()


def test_a_table_the_numpy_path_does_not_take_goes_to_pandas():
    frame = samples(3)
    frame.loc[5, "RemoteAddr"] = None
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert nic.throughput(table) is NotImplemented
    model = load_model("pipeline.models.nic:throughput")
    results, metrics = run_model(model, table)
    expected, expected_metrics = run_model(model, frame)
    assert results.equals(expected) and metrics == expected_metrics
    narrow = frame.dropna().astype({"RxBytes": "int32"})  # not int64: the definition runs
    assert nic._per_second(pa.Table.from_pandas(narrow, preserve_index=False)) is None
    pd.testing.assert_frame_equal(nic._per_second(narrow), nic._per_second_frame(narrow))


@pytest.fixture
def pandas_model(tmp_path, monkeypatch):
    (tmp_path / "seen_model.py").write_text(
        "import pandas as pd\n"
        "def seen(frame):\n"
        "    kinds = {c: str(t) for c, t in frame.dtypes.items()}\n"
        "    return pd.DataFrame({'column': list(kinds), 'dtype': list(kinds.values())})\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return load_model("seen_model:seen")


def test_a_pandas_model_gets_dictionary_columns_decoded(pandas_model):
    table = as_dictionary(pa.Table.from_pandas(samples(2), preserve_index=False))
    results, _ = run_model(pandas_model, table)
    kinds = dict(zip(*results.to_pydict().values(), strict=True))
    assert not takes_arrow(pandas_model)
    assert kinds["RemoteAddr"] == kinds["Interface"] == "str"
    assert kinds["TimestampNanos"] == "int64"
