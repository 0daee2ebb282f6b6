"""`sluice join`'s output: written in the format its extension names (`.parquet`, `.csv`),
any other extension refused before any input is read; and its counts in words."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.timejoin import JoinInputError, JoinOutputError, join_files, join_tables

PAIRS = [(10, 0.1), (11, 0.1), (11, 0.2), (12, 0.2)]


@pytest.fixture
def inputs(tmp_path) -> tuple[Path, Path]:
    left, right = tmp_path / "left.csv", tmp_path / "right.csv"
    left.write_text("time,rx\n0.0,10\n1.0,11\n2.0,12\n")
    right.write_text("time,accel\n0.5,0.1\n1.5,0.2\n")
    return left, right


def join(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["join", *args])
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("name", ["pairs.csv", "PAIRS.CSV"])
def test_a_csv_output_is_written_as_csv_and_joins_again(tmp_path, inputs, capsys, name):
    out = tmp_path / name
    assert join(capsys, *map(str, inputs), "-o", str(out)) == (0, "")
    assert out.read_text().splitlines()[0] == '"left_time","left_rx","right_time","right_accel"'
    rows = pacsv.read_csv(out).to_pylist()
    assert [(r["left_rx"], r["right_accel"]) for r in rows] == PAIRS
    again = tmp_path / "again.parquet"  # what the join writes, it reads
    join_files(out, out, again, time_column="left_time")
    assert pq.read_table(again).num_rows > 0


@pytest.mark.parametrize("name", ["pairs.parquet", "pairs.pq"])
def test_a_parquet_output_is_written_as_parquet(tmp_path, inputs, capsys, name):
    out = tmp_path / name
    assert join(capsys, *map(str, inputs), "-o", str(out)) == (0, "")
    rows = pq.read_table(out).to_pylist()
    assert [(r["left_rx"], r["right_accel"]) for r in rows] == PAIRS


def test_timestamps_with_a_zone_survive_a_csv_output(tmp_path, capsys):
    stamps = pa.array([0, 2_000_000_000], pa.timestamp("ns", "UTC"))
    pq.write_table(pa.table({"time": stamps, "v": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"time": stamps, "w": [3, 4]}), tmp_path / "b.parquet")
    out = tmp_path / "pairs.csv"
    argv = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "-o", str(out)]
    assert join(capsys, *argv) == (0, "")
    back = pacsv.read_csv(out)
    assert back["left_time"].type == pa.timestamp("ns", "UTC")
    assert back["left_time"].to_pylist() == back["right_time"].to_pylist()


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("pairs.txt", "'.txt' is no format the join writes"),
        ("pairs.json", "'.json' is no format the join writes"),
        ("pairs", "it has no extension"),
    ],
)
def test_any_other_extension_is_refused_before_the_inputs_are_read(
    tmp_path, inputs, capsys, name, reason
):
    out = tmp_path / name
    missing = tmp_path / "missing.csv"  # never read: the output is refused first
    code, err = join(capsys, str(missing), str(inputs[1]), "-o", str(out))
    assert (code, err) == (
        1,
        f"sluice: error: cannot write the join to {out}: {reason}: end the name in .parquet "
        "(Parquet) or .csv (CSV)",
    )
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["left.csv", "right.csv"]


def test_nested_columns_are_refused_for_csv_and_nothing_is_written(tmp_path, capsys):
    table = pa.table({"time": [1.0, 2.0], "tags": [["a"], ["b", "c"]]})
    pq.write_table(table, tmp_path / "a.parquet")
    pq.write_table(pa.table({"time": [1.5]}), tmp_path / "b.parquet")
    out = tmp_path / "pairs.csv"
    with pytest.raises(JoinOutputError, match=re.escape("left_tags (list<element: string>)")):
        join_files(tmp_path / "a.parquet", tmp_path / "b.parquet", out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet"]


def test_the_join_help_says_the_output_follows_its_extension(capsys):
    with pytest.raises(SystemExit):
        cli.main(["join", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ".parquet (Parquet) or .csv (CSV); any other is refused" in help_text


@pytest.mark.parametrize(
    ("missing", "said"),
    [
        (1, "1 record has no 'time': fill or drop it first"),
        (2, "2 records have no 'time': fill or drop them first"),
    ],
)
def test_records_without_a_time_are_counted_in_words(missing, said):
    nulls = pa.table({"time": pa.array([None] * missing + [1.0], pa.float64())})
    with pytest.raises(JoinInputError, match=re.escape(f"cannot join the left series: {said}")):
        join_tables(nulls, pa.table({"time": [1.0]}))
