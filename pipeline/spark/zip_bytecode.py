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
