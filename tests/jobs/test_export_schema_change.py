"""A schema changed between two runs of one export: written so the views read every file, or
refused in one line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from pipeline import cli

pytestmark = pytest.mark.spark

T0 = 1_609_362_000_000_000_000


def schema(kind: str, extra: tuple[dict, ...] = ()) -> str:
    fields = [
        {"name": "site", "type": "string"},
        {"name": "x", "type": kind},
        {"name": "tNanos", "type": {"type": "array", "items": "long"}},
        *extra,
    ]
    return json.dumps({"type": "record", "name": "T", "fields": fields})


def run(store_dir: Path, avsc: Path, output: Path) -> int:
    argv = ["--store", f"embedded:{store_dir}", "run", "export", "--stream", "edge/t"]
    argv += ["--schema", str(avsc), "--output", str(output), "--format", "parquet"]
    return cli.main(argv)


def write(store, x: object) -> None:
    event = {"site": "s", "x": x, "tNanos": [T0], "n": 1}
    with store.writer("edge/t") as writer:
        writer.write(json.dumps(event).encode(), routing_key="a")


def rows(output: Path) -> list[tuple]:
    glob = f"{output}/parquet/date=*/hour=*/*.parquet"
    query = f"SELECT x FROM read_parquet('{glob}', hive_partitioning=true, union_by_name=true)"
    return duckdb.connect().execute(f"{query} ORDER BY _offset").fetchall()


def exported_as_int(store, store_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A first run of the export with `x` an int; its schema file and output."""
    store.create_stream("edge/t", segments=1)
    avsc, out = tmp_path / "t.avsc", tmp_path / "out"
    avsc.write_text(schema("int"))
    write(store, 1)
    assert run(store_dir, avsc, out) == 0
    return avsc, out


def test_a_column_whose_type_changes_is_refused_before_anything_is_written(
    spark, store, store_dir, tmp_path, capsys
):
    avsc, out = exported_as_int(store, store_dir, tmp_path)
    capsys.readouterr()
    avsc.write_text(schema("bytes"))  # DuckDB cannot read an INTEGER and a BLOB as one column
    write(store, "\u0001")
    assert run(store_dir, avsc, out) == 1
    err = capsys.readouterr().err.strip()
    assert "column 'x' binary, but the files already there hold it as int32" in err
    assert err.splitlines()[-1].startswith("sluice: error: export to") and "Traceback" not in err
    assert len(list(out.glob("parquet/**/*.parquet"))) == 1
    assert rows(out) == [(1,)]


def test_a_new_field_and_a_widened_number_are_written_and_read_with_the_old_files(
    spark, store, store_dir, tmp_path, capsys
):
    avsc, out = exported_as_int(store, store_dir, tmp_path)
    avsc.write_text(schema("double", ({"name": "n", "type": "long", "default": 0},)))
    write(store, 2.5)
    assert run(store_dir, avsc, out) == 0, capsys.readouterr().err
    assert rows(out) == [(1.0,), (2.5,)]
    # back to int: the oldest file holds one, but the newest holds doubles (a narrowing)
    avsc.write_text(schema("int"))
    assert run(store_dir, avsc, out) == 1
    assert "column 'x' int32, but the files already there hold it as double" in (
        capsys.readouterr().err
    )
