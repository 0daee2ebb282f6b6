"""Compiled bytecode inside Spark's `pyspark.zip`, which every Spark Python process imports.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on the `PYTHONPATH` of every Python
process it starts (`PythonUtils.sparkPythonPath`): the Python workers of tasks, the planners
of Python data sources, the streaming source and sink runners, and the Connect server's
`foreachBatch` processes. So they import pyspark from the zip, not from site-packages, and
the zip that the `pyspark` wheel ships holds `.py` files only: Python cannot write bytecode
into a zip, so each of those processes compiles every pyspark module it imports again
(`import pyspark.worker` 1.8 s from the zip against 0.4 s from site-packages here).

`add_bytecode` rewrites the zip with a `.pyc` beside each `.py` (unchecked hash-based pycs,
PEP 552: `zipimport` loads them without comparing times, which a zip keeps only to two
seconds). The `.py` files stay, so tracebacks still show source. The new zip replaces the old
one atomically (a new file, never the old inode: package managers hard-link installed files
from their cache). `make install` runs it (`python -m pipeline.spark.zip_bytecode`); a zip
that already holds bytecode is left alone, and a reinstalled pyspark gets it again.
`without_bytecode` names what the server's Python processes would still compile each time
(`sluice spark start` warns with `bytecode_advice`).
"""

from __future__ import annotations

import importlib.util
import marshal
import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

#: A zip with this entry holds Sluice's bytecode already (its pyspark/__init__.pyc).
MARKER = "pyspark/__init__.pyc"


def pyspark_zip() -> Path | None:
    """The `pyspark.zip` that Spark puts on its Python processes' path, if there is one."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    home = Path(os.environ.get("SPARK_HOME") or next(iter(spec.submodule_search_locations)))
    path = home / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


def has_bytecode(path: Path) -> bool:
    """Does the zip hold Sluice's bytecode? False for one that is not a readable zip."""
    try:
        with zipfile.ZipFile(path) as archive:
            return MARKER in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _pyc(source: bytes, name: str) -> bytes:
    """An unchecked hash-based pyc of `source` (PEP 552), as `py_compile` would write it."""
    from importlib.util import MAGIC_NUMBER, source_hash

    with warnings.catch_warnings():  # pyspark's own tests warn about `is` with a literal
        warnings.simplefilter("ignore", SyntaxWarning)
        code = compile(source, name, "exec", dont_inherit=True)

    flags = (0b01).to_bytes(4, "little")  # hash-based, unchecked
    return MAGIC_NUMBER + flags + source_hash(source) + marshal.dumps(code)


def add_bytecode(path: Path) -> int:
    """Rewrite the zip at `path` with a `.pyc` beside each `.py` it holds; the number of
    modules compiled (0 if it had them already). A module that does not compile with this
    Python is left as source only."""
    if has_bytecode(path):
        return 0
    compiled = 0
    fd, temporary = tempfile.mkstemp(prefix=".pyspark-", suffix=".zip", dir=path.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(path) as old, zipfile.ZipFile(temporary, "w") as new:
            names = set(old.namelist())
            for info in old.infolist():
                data = old.read(info)
                new.writestr(info, data)
                target = info.filename[:-3] + ".pyc"
                if not info.filename.endswith(".py") or target in names:
                    continue
                try:
                    pyc = _pyc(data, f"{path}/{info.filename}")
                except (SyntaxError, ValueError):
                    continue
                entry = zipfile.ZipInfo(target, date_time=info.date_time)
                entry.compress_type = zipfile.ZIP_DEFLATED
                new.writestr(entry, pyc)
                compiled += 1
        os.chmod(temporary, path.stat().st_mode & 0o777)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return compiled


#: What the server's new Python processes import first: its `foreachBatch` process (one per
#: streaming query), the Python workers of its tasks and Sluice's data sources.
SERVER_PYTHON_MODULES = (
    "pyspark.sql.connect.streaming.worker.foreach_batch_worker",
    "pyspark.worker",
    "pandas",
    "pipeline.spark.source",
)


def without_bytecode(modules: tuple[str, ...] = SERVER_PYTHON_MODULES) -> list[str]:
    """Spark's `pyspark.zip` if it holds no bytecode, and the modules among `modules` that
    have no up-to-date compiled bytecode where this Python looks for it and that no Python
    process will write it for (PYTHONDONTWRITEBYTECODE, a read-only install). Every new
    Python process compiles those again: the server's `foreachBatch` process then took 4 to 6 s
    to start on an idle 2-core machine and over Spark's 10 s on a busy one ("Python worker
    failed to connect back"); `benchmarks/bytecode.py`."""
    import importlib.util

    missing = []
    spark_zip = pyspark_zip()
    if spark_zip is not None and not has_bytecode(spark_zip):
        missing.append(str(spark_zip))  # what Spark's Python processes import pyspark from
    for name in modules:
        if spark_zip is not None and name.split(".")[0] == "pyspark":
            continue
        if (source := _source_file(name)) is None:
            continue
        cache = importlib.util.cache_from_source(source)
        if not sys.dont_write_bytecode and _writable(Path(cache).parent):
            continue  # the first process that imports it writes it
        try:
            with open(cache, "rb") as cached:
                header = cached.read(16)
            stat = os.stat(source)
        except OSError:
            missing.append(name)
            continue
        flags = int.from_bytes(header[4:8], "little")
        stamp = (int.from_bytes(header[8:12], "little"), int.from_bytes(header[12:16], "little"))
        if flags == 0 and stamp != (int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF):
            missing.append(name)
    return missing


def _writable(directory: Path) -> bool:
    """Can this user write `directory`, or create it under its nearest existing parent?"""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    return os.access(directory, os.W_OK)


def _source_file(name: str) -> str | None:
    """The `.py` file of module `name`, found without importing it or its packages (the
    server's modules import pandas, which warns about its version on import)."""
    import importlib.util

    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or spec.origin is None:
        return None
    if not rest:
        return spec.origin if spec.origin.endswith(".py") else None
    if not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations)), *rest)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return str(candidate)
    return None


def bytecode_advice(missing: list[str]) -> str:
    return (
        f"no compiled bytecode for {', '.join(missing)}: each Python process the server starts "
        "compiles them again, and one that needs over 10 s fails with 'Python worker failed "
        "to connect back'. Compile them once, as `make install` does: `uv sync "
        f"--compile-bytecode` (or `{sys.executable} -m compileall -q <site-packages> <sluice "
        f"checkout>`) and `{sys.executable} -m pipeline.spark.zip_bytecode` (pyspark.zip)"
    )


def main() -> int:
    path = pyspark_zip()
    if path is None:
        print("no pyspark.zip found: nothing to do", file=sys.stderr)
        return 0
    try:
        compiled = add_bytecode(path)
    except (OSError, zipfile.BadZipFile) as exc:  # a read-only install, a damaged zip: Spark's
        # Python processes compile as before (and a damaged zip fails in Spark on its own)
        print(f"could not add bytecode to {path}: {exc}", file=sys.stderr)
        return 0
    if compiled:
        print(f"added bytecode for {compiled} modules to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
