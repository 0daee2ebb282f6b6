"""The schema of an export over its life: the file edited while a run goes on, and a changed
schema checked against the one the export's earlier runs used (Avro's resolution rules)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from pipeline.errors import SluiceError
from pipeline.jobs.export import ExportSpec, export
from pipeline.jobs.runner import RunOptions

pytestmark = pytest.mark.spark

T0 = 1_609_362_000_000_000_000
SITE = {"name": "site", "type": "string"}
TIMES = {"name": "tNanos", "type": {"type": "array", "items": "long"}}


def schema(*fields: dict, **top: object) -> str:
    return json.dumps({"type": "record", "name": "T", "fields": list(fields), **top})


def x(kind: str) -> dict:
    return {"name": "x", "type": kind}


def write(store, **event: object) -> None:
    event = {"site": "s", "tNanos": [T0], **event}
    with store.writer("edge/t") as writer:
        writer.write(json.dumps(event).encode(), routing_key="a")


def run(spark, store_dir: Path, avsc: Path, output: Path) -> int:
    """One run of the export until caught up; its rows."""
    spec = ExportSpec("edge/t", str(avsc), output, f"embedded:{store_dir}")
    return export(spark, spec, RunOptions()).rows


def parquet(output: Path, columns: str) -> list[tuple]:
    files = f"{output}/parquet/date=*/hour=*/*.parquet"
    reading = f"read_parquet('{files}', hive_partitioning=true, union_by_name=true)"
    query = f"SELECT {columns} FROM {reading} ORDER BY _offset, _sample"
    return duckdb.connect().execute(query).fetchall()


def published(output: Path) -> list[Path]:
    return sorted(output.glob("parquet/date=*/hour=*/*.parquet"))


@pytest.mark.slow
def test_a_schema_file_edited_while_a_continuous_export_runs_waits_for_the_next_run(
    spark, store, store_dir, tmp_path
):
    """The run checked the schema it started with against the output's files; its batches
    flatten through that schema, not through whatever the file holds by then."""
    store.create_stream("edge/t", segments=1)
    avsc, out = tmp_path / "t.avsc", tmp_path / "out"
    avsc.write_text(schema(SITE, x("int"), TIMES))
    done = threading.Event()

    def edit_between_batches() -> None:
        write(store, x=1)
        deadline = time.monotonic() + 120
        while not published(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        avsc.write_text(schema(SITE, x("bytes"), TIMES))  # no query reads int and bytes as one
        write(store, x="\u0001")
        done.set()

    editor = threading.Thread(target=edit_between_batches)
    editor.start()
    try:
        options = RunOptions(mode="continuous", trigger_seconds=1.0, stop_after_seconds=25)
        spec = ExportSpec("edge/t", str(avsc), out, f"embedded:{store_dir}", ("parquet",))
        summary = export(spark, spec, options)
    finally:
        editor.join()
    assert done.is_set() and summary.rows == 1 and summary.quarantined == 1
    assert {str(pq.read_schema(f).field("x").type) for f in published(out)} == {"int32"}
    assert parquet(out, "x") == [(1,)]


def csv_rows(output: Path, columns: str) -> list[tuple]:
    files = f"{output}/csv/date=*/hour=*/*.csv"
    reading = f"read_csv('{files}', hive_partitioning=true, union_by_name=true)"
    query = f"SELECT {columns} FROM {reading} ORDER BY _offset, _sample"
    return duckdb.connect().execute(query).fetchall()


@pytest.mark.slow
def test_compatible_changes_go_on_and_the_files_of_every_version_read_as_one_table(
    spark, store, store_dir, tmp_path
):
    store.create_stream("edge/t", segments=1)
    avsc, out = tmp_path / "t.avsc", tmp_path / "out"
    avsc.write_text(schema(SITE, x("int"), TIMES))
    write(store, site="a", x=1)
    assert run(spark, store_dir, avsc, out) == 1
    # the same schema in other words: docs, indentation (not ParametersChanged)
    avsc.write_text(schema({**SITE, "doc": "the plant"}, x("int"), TIMES, doc="v1") + "\n\n")
    write(store, site="b", x=2)
    assert run(spark, store_dir, avsc, out) == 1
    # a field with a default added in the middle, a parallel array added (default []), x
    # widened: an older event takes the default, and nulls for the array's samples
    n = {"name": "n", "type": "long", "default": 7}
    temp = {"name": "temp", "type": {"type": "array", "items": "double"}, "default": []}
    avsc.write_text(schema(SITE, n, x("long"), TIMES, temp))
    write(store, site="c", x=3)
    write(store, site="d", x=2**40, n=1, temp=[0.5])
    assert run(spark, store_dir, avsc, out) == 2
    # n removed again
    avsc.write_text(schema(SITE, x("long"), TIMES, temp))
    write(store, site="e", x=5)
    assert run(spark, store_dir, avsc, out) == 1
    expected = [
        ("a", 1, None, None),
        ("b", 2, None, None),
        ("c", 3, 7, None),
        ("d", 2**40, 1, 0.5),
        ("e", 5, None, None),
    ]
    assert parquet(out, "site, x, n, temp") == expected
    assert csv_rows(out, "site, x, n, temp") == expected
    assert not list(out.glob("_quarantine/*"))


@pytest.mark.slow
def test_an_incompatible_change_is_refused_naming_the_field_before_anything_is_written(
    spark, store, store_dir, tmp_path
):
    store.create_stream("edge/t", segments=1)
    avsc, out = tmp_path / "t.avsc", tmp_path / "out"
    avsc.write_text(schema(SITE, x("int"), TIMES))
    write(store, site="a", x=1)
    assert run(spark, store_dir, avsc, out) == 1
    write(store, site="b", x=2)  # written under the first schema, not exported yet
    refused = {
        "m": (schema(SITE, x("int"), TIMES, {"name": "m", "type": "long"}), "is new and has no"),
        "location": (
            schema({"name": "location", "type": "string", "aliases": ["site"]}, x("int"), TIMES),
            "renames field 'site' (an alias)",
        ),
    }
    for field, (text, reason) in refused.items():
        avsc.write_text(text)
        said = f"export to {out}: schema {avsc} does not fit the events of the schema its "
        with pytest.raises(SluiceError, match=re.escape(said)) as refusal:
            run(spark, store_dir, avsc, out)
        assert type(refusal.value).__name__ == "SchemaIncompatible"
        assert f"field {field!r} {reason}" in str(refusal.value)
    assert len(published(out)) == 1
    # with a default, the new field goes on; the waiting event takes it
    avsc.write_text(schema(SITE, x("int"), TIMES, {"name": "m", "type": "long", "default": 0}))
    assert run(spark, store_dir, avsc, out) == 1
    assert parquet(out, "site, m") == [("a", None), ("b", 0)]
