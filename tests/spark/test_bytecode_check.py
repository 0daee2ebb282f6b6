"""`sluice spark start` warns when the server's Python processes would compile their modules
again in every process (no up-to-date `.pyc`): `zip_bytecode.without_bytecode`."""

from __future__ import annotations

import importlib.util
import py_compile
import sys
import zipfile

from pipeline.spark import zip_bytecode


def test_modules_without_up_to_date_bytecode_are_named_without_importing_them(
    tmp_path, monkeypatch
):
    package = tmp_path / "noisy"
    (package / "inner").mkdir(parents=True)
    # importing would fail: the check must find the files, not import them
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "inner" / "__init__.py").write_text("")
    module = package / "inner" / "work.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # a Spark home without a pyspark.zip
    names = ("noisy.inner.work", "noisy", "no_such_module_here")

    # where Python may write bytecode, the first process that imports a module writes it
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    assert zip_bytecode.without_bytecode(names) == []

    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # PYTHONDONTWRITEBYTECODE=1
    assert zip_bytecode.without_bytecode(names) == ["noisy.inner.work", "noisy"]

    for source in (module, package / "__init__.py"):
        py_compile.compile(str(source), cfile=importlib.util.cache_from_source(str(source)))
    assert zip_bytecode.without_bytecode(names) == []

    module.write_text("VALUE = 22\n")  # changed since it was compiled: stale
    assert zip_bytecode.without_bytecode(names) == ["noisy.inner.work"]


def test_the_advice_names_the_modules_and_the_fix():
    advice = zip_bytecode.bytecode_advice(["pyspark.worker", "pandas"])
    assert "pyspark.worker, pandas" in advice
    assert "--compile-bytecode" in advice and "compileall" in advice
    assert "connect back" in advice


def test_a_pyspark_zip_without_bytecode_is_named(tmp_path, monkeypatch):
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    with zipfile.ZipFile(lib / "pyspark.zip", "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    assert zip_bytecode.without_bytecode(()) == [str(lib / "pyspark.zip")]
    zip_bytecode.add_bytecode(lib / "pyspark.zip")
    assert zip_bytecode.without_bytecode(()) == []
