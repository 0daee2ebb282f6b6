"""Bytecode inside a `pyspark.zip`: Python imports it from the zip, unchanged in behaviour."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from pipeline.spark.zip_bytecode import add_bytecode, has_bytecode, main


def make_zip(path):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/__init__.py", "NAME = 'zipped'\n")
        archive.writestr("pyspark/worker.py", "def double(x):\n    return 2 * x\n")
        archive.writestr("pyspark/broken.py", "def (:\n")  # does not compile: stays source
        archive.writestr("pyspark/data.txt", "not python")


def imported_from(path, module):
    env = {**os.environ, "PYTHONPATH": str(path), "PYTHONDONTWRITEBYTECODE": "1"}
    code = f"import {module} as m; print(m.__file__); print(m.double(21))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_modules_are_imported_from_the_bytecode_in_the_zip(tmp_path):
    spark_zip = tmp_path / "pyspark.zip"
    make_zip(spark_zip)
    before = imported_from(spark_zip, "pyspark.worker")
    assert before[0].endswith("pyspark/worker.py") and before[1] == "42"

    assert add_bytecode(spark_zip) == 2  # __init__ and worker; broken.py stays source only
    with zipfile.ZipFile(spark_zip) as archive:
        names = set(archive.namelist())
        assert archive.read("pyspark/data.txt") == b"not python"
    assert {"pyspark/__init__.pyc", "pyspark/worker.pyc"} <= names
    assert "pyspark/broken.pyc" not in names and "pyspark/worker.py" in names
    after = imported_from(spark_zip, "pyspark.worker")
    assert after[0].endswith("pyspark/worker.pyc") and after[1] == "42"
    assert has_bytecode(spark_zip)
    assert add_bytecode(spark_zip) == 0  # once is enough


def test_the_zip_is_replaced_never_rewritten_in_place(tmp_path):
    """Package managers hard-link installed files from their cache: the cache's copy must
    stay as it was."""
    spark_zip = tmp_path / "pyspark.zip"
    make_zip(spark_zip)
    cached = tmp_path / "cache-copy.zip"
    os.link(spark_zip, cached)
    original = cached.read_bytes()
    add_bytecode(spark_zip)
    assert cached.read_bytes() == original
    assert not has_bytecode(cached) and has_bytecode(spark_zip)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pyspark-")] == []


def test_a_damaged_zip_is_reported_not_a_traceback(tmp_path, monkeypatch, capsys):
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    (lib / "pyspark.zip").write_bytes(b"not a zip at all")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert not has_bytecode(lib / "pyspark.zip")
    assert main() == 0
    assert "could not add bytecode" in capsys.readouterr().err
    assert (lib / "pyspark.zip").read_bytes() == b"not a zip at all"
