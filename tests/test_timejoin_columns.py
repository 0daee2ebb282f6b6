"""How `sluice join` moves columns: times from Arrow to numpy and row numbers back through the
buffers (no pandas), Parquet written with dictionaries only where values repeat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.timejoin import _indices, _numbers, join_files, join_tables

REPO = Path(__file__).resolve().parents[1]

TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64(), pa.float32(), pa.float64()]


@pytest.mark.parametrize("kind", TYPES, ids=str)
def test_numbers_are_the_columns_values_however_it_is_chunked_or_sliced(kind):
    values = pa.array([3, 1, 4, 1, 5, 9, 2, 6], kind)
    chunked = pa.chunked_array([values.slice(1, 3), values.slice(4, 0), values.slice(5)])
    for column in (values, values.slice(2, 5), chunked, pa.chunked_array([], kind)):
        got = _numbers(column)
        assert got.dtype == column.to_numpy().dtype
        assert got.tolist() == column.to_pylist()


def test_a_timestamp_is_its_int64_count():
    stamps = pa.array([1_700_000_000_123_456_789, -5, 0], pa.timestamp("ns", tz="UTC"))
    assert _numbers(stamps).tolist() == [1_700_000_000_123_456_789, -5, 0]
    assert _numbers(stamps).dtype == np.int64


def test_indices_share_the_arrays_memory_and_values():
    rows = np.array([4, 0, 2], dtype=np.int64)
    indices = _indices(rows)
    assert indices.type == pa.int64() and indices.to_pylist() == [4, 0, 2]
    assert _numbers(indices).__array_interface__["data"][0] == rows.__array_interface__["data"][0]
    assert _indices(np.array([1, 2], dtype=np.int32)).to_pylist() == [1, 2]


def test_the_output_has_dictionaries_on_text_columns_only(tmp_path):
    left = pa.table({"time": [0.0, 1.0, 2.0], "host": ["a", "a", "b"], "rx": [1, 2, 3]})
    right = pa.table({"time": [0.5, 1.5], "accel": [0.1, 0.2]})
    pq.write_table(left, tmp_path / "L.parquet")
    pq.write_table(right, tmp_path / "R.parquet")
    result = join_files(tmp_path / "L.parquet", tmp_path / "R.parquet", tmp_path / "out.parquet")
    written = pq.read_table(tmp_path / "out.parquet")
    assert written.equals(join_tables(left, right).table)
    assert result.pairs == written.num_rows
    row_group = pq.read_metadata(tmp_path / "out.parquet").row_group(0)
    dictionary = {
        row_group.column(i).path_in_schema: row_group.column(i).has_dictionary_page
        for i in range(row_group.num_columns)
    }
    assert dictionary == {
        "left_time": False,
        "left_host": True,
        "left_rx": False,
        "right_time": False,
        "right_accel": False,
    }


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_the_join_command_imports_no_pandas(tmp_path, fmt):
    left = pa.table({"time": [0.0, 1.0, 2.0], "rx": [1, 2, 3]})
    right = pa.table({"time": pa.array([0.5, 1.5], pa.float32()), "accel": [0.1, 0.2]})
    for name, table in (("L", left), ("R", right)):
        if fmt == "parquet":
            pq.write_table(table, tmp_path / f"{name}.parquet")
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, tmp_path / f"{name}.csv")
    program = (
        "import sys; from pipeline.cli import main; "
        f"code = main(['join', 'L.{fmt}', 'R.{fmt}', '-o', 'out.parquet']); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    summary, imported = done.stdout.strip().splitlines()
    assert json.loads(summary)["pairs"] == 4
    assert imported == "[]"
