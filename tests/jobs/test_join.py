"""`sluice join` with bad input (issue 13): every malformed input and every output that would
destroy an input is one typed error, and the inputs are left as they were, with nothing
written (not even a staging file)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.timejoin import (
    InvalidMaxGap,
    JoinInputError,
    JoinOutputError,
    join_files,
    join_tables,
)


@pytest.fixture
def inputs(tmp_path) -> tuple[Path, Path]:
    left, right = tmp_path / "L.csv", tmp_path / "R.csv"
    left.write_text("time,rx\n0.0,10\n1.0,11\n")
    right.write_text("time,accel\n0.5,0.1\n")
    return left, right


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (links as what they point to) and its bytes."""
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(directory.rglob("*"))
    }


def refused(capsys, args: list[str]) -> str:
    assert cli.main(["join", *args]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("how", ["same path", "another spelling", "symbolic link", "hard link"])
def test_an_output_that_is_an_input_is_refused(tmp_path, inputs, capsys, how):
    left, right = inputs
    if how == "same path":
        output = left
    elif how == "another spelling":
        (tmp_path / "sub").mkdir()
        output = tmp_path / "sub" / ".." / "L.csv"
    elif how == "symbolic link":
        output = tmp_path / "link.csv"
        output.symlink_to(left)
    else:
        output = tmp_path / "hard.csv"
        os.link(left, output)
    before = snapshot(tmp_path)
    with pytest.raises(JoinOutputError, match=re.escape("it is the input")):
        join_files(left, right, output)
    message = refused(capsys, [str(left), str(right), "-o", str(output)])
    assert message == (
        f"sluice: error: cannot write the join to {output}: it is the input {left}: "
        "choose another output file"
    )
    assert snapshot(tmp_path) == before


def test_an_output_that_is_a_directory_is_refused_and_leaves_nothing(tmp_path, inputs, capsys):
    left, right = inputs
    target = tmp_path / "out"
    target.mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(JoinOutputError, match=re.escape("it is a directory: give a file name")):
        join_files(left, right, target)
    refused(capsys, [str(left), str(right), "-o", str(target)])
    assert snapshot(tmp_path) == before  # no staging file (.out.tmp, .join.tmp) left


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty.csv", b"", "the file is empty (0 bytes)"),
        (
            "fake.parquet",
            b"time,rx\n1,2\n",
            "not a readable Parquet file (Parquet magic bytes not found",
        ),
        ("twice.csv", b"time,rx,rx\n1,2,3\n", "it repeats the column name(s) 'rx': rename them"),
        ("bad.csv", b"time,rx\n1,2,3\n", "not a readable CSV file (CSV parse error"),
    ],
)
def test_malformed_inputs_are_refused_with_the_reason(  # noqa: PLR0917
    tmp_path, inputs, capsys, name, content, reason
):
    _, right = inputs
    bad = tmp_path / name
    bad.write_bytes(content)
    output = tmp_path / "pairs.parquet"
    before = snapshot(tmp_path)
    with pytest.raises(JoinInputError, match=re.escape(f"cannot join {bad}: {reason}")):
        join_files(bad, right, output)
    assert refused(capsys, [str(bad), str(right), "-o", str(output)]).startswith(
        f"sluice: error: cannot join {bad}: {reason}"
    )
    assert snapshot(tmp_path) == before


def test_a_parquet_file_with_a_repeated_column_is_refused(tmp_path, inputs):
    _, right = inputs
    twice = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1.0]), pa.array([2])], ["time", "time"]), twice)
    with pytest.raises(JoinInputError, match=re.escape("repeats the column name(s) 'time'")):
        join_files(twice, right, tmp_path / "pairs.parquet")


@pytest.mark.parametrize("gap", ["nan", "inf", "-inf", "-1"])
def test_max_gap_must_be_finite_and_not_negative(tmp_path, inputs, capsys, gap):
    left, right = inputs
    output = tmp_path / "pairs.parquet"
    with pytest.raises(InvalidMaxGap):
        join_files(left, right, output, max_gap=float(gap))
    message = refused(capsys, [str(left), str(right), "-o", str(output), f"--max-gap={gap}"])
    assert message == (
        f"sluice: error: max gap {float(gap)!r}: give a finite number of seconds, zero or more "
        "(--max-gap)"
    )
    assert not output.exists()


@pytest.mark.parametrize("bad", [math.inf, -math.inf])
def test_infinite_times_are_refused_like_nan(bad):
    good = pa.table({"time": [1.0]})
    with pytest.raises(JoinInputError, match=re.escape("1 time(s) are infinite")):
        join_tables(pa.table({"time": [0.0, bad]}), good)
    with pytest.raises(JoinInputError, match=re.escape("1 time(s) are infinite")):
        join_tables(good, pa.table({"time": [bad, 2.0]}))


def test_infinite_times_in_a_file_are_refused(tmp_path, inputs, capsys):
    _, right = inputs
    left = tmp_path / "inf.csv"
    left.write_text("time,rx\n0.0,1\ninf,2\n")
    message = refused(capsys, [str(left), str(right), "-o", str(tmp_path / "o.parquet")])
    assert message.endswith("1 time(s) are infinite: drop or fix those records first")


def test_a_header_only_csv_joins_to_nothing(tmp_path, inputs):
    _, right = inputs
    left = tmp_path / "header.csv"
    left.write_text("time,rx\n")
    result = join_files(left, right, tmp_path / "pairs.parquet")
    assert (result.pairs, result.left_rows, result.right_rows) == (0, 0, 1)
