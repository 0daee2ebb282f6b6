"""A class-data-sharing archive of the classes a Spark driver loads: local JVMs start sooner.

A local Spark session's JVM spends most of its start-up loading, parsing and verifying the
same few thousand classes from Spark's jars. Java's dynamic class-data-sharing archive
(JEP 350, `-XX:ArchiveClassesAtExit` / `-XX:SharedArchiveFile`) records them once, parsed and
verified, and every later JVM maps the file instead (`benchmarks/spark_startup.py` measures
it beside a JVM without).

- **Where:** `$XDG_CACHE_HOME/sluice/spark-classes/<key>.jsa` (about 160 MB; `~/.cache` when
  `XDG_CACHE_HOME` is unset), one per Java and Spark install: `key` hashes the Java home
  (its `release` file and `libjvm.so`), pyspark's version and Spark's jars with their sizes
  and modification times. The JVM maps an archive only when every jar on the class path has
  the size and time it had at the dump, and otherwise starts without it, silently; so a
  reinstalled virtual environment (same jars, new times) gets a new key and a new archive
  rather than a stale one that is never mapped. It is a cache: deleting it costs one
  rebuild; a build removes the archives of other installs that no session used for
  `UNUSED_DAYS` days (`<key>.used` is touched by every session that maps one).
- **Built:** by the first local session that finds none, in the background (a detached,
  low-priority process, one per machine at a time: `<key>.lock`), so no job waits for it.
  The builder runs a small Spark job through `spark-submit` with `-XX:ArchiveClassesAtExit`
  and renames the archive into place only when that JVM exited cleanly; an interrupted build
  leaves no archive and the next session starts another; after a failed build (`<key>.failed`)
  sessions wait a day before trying again. `sluice spark archive` builds it in the foreground
  at once; its log is `<key>.log`.
- **Used:** `-XX:SharedArchiveFile` on the driver JVM of local sessions and of the Spark
  Connect server. A JVM that cannot map the file (another JDK, a damaged file) starts without
  it, silently: the archive can make a start faster, never fail it.
- **Off:** `[spark] class_archive = false` or `SLUICE_SPARK_CLASS_ARCHIVE=false`.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from pipeline.errors import SluiceError

log = logging.getLogger(__name__)

#: JVM options that keep the archive quiet: the dump's and the mapping's own warnings
#: (skipped signed jars, "optimized module handling disabled") are not for users.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
#: the builder's Spark logs at ERROR, as a session's does (its log is the build's log)
LOG4J = f"-Dlog4j2.configurationFile=file:{Path(__file__).with_name('log4j2.properties')}"


class ArchiveError(SluiceError):
    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"archive of Spark's classes: {problem}")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice" / "spark-classes"


def java_home() -> Path | None:
    """The Java pyspark starts: `$JAVA_HOME`, else the `java` on `PATH`."""
    if os.environ.get("JAVA_HOME"):
        return Path(os.environ["JAVA_HOME"])
    java = shutil.which("java")
    return Path(java).resolve().parents[1] if java else None


def install_key() -> str | None:
    """A name for this Java and Spark install; None when there is no Java to key on."""
    import pyspark

    home = java_home()
    if home is None:
        return None
    digest = hashlib.sha256()
    digest.update(f"{home.resolve()}\0{pyspark.__version__}\0".encode())
    for path in (home / "release", home / "lib" / "server" / "libjvm.so"):
        if path.exists():
            stat = path.stat()
            digest.update(f"{path.name}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("*.jar")):
        stat = jar.stat()  # what the JVM checks before it maps an archive
        digest.update(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()[:16]


def archive_path() -> Path | None:
    key = install_key()
    return None if key is None else cache_dir() / f"{key}.jsa"


def with_archive(conf: Mapping[str, str], *, build: bool = True) -> dict[str, str]:
    """`conf` with the driver JVM mapping the archive when it exists; when it does not and
    `build`, a background build is started for the sessions after this one."""
    out = dict(conf)
    try:
        path = archive_path()
        if path is not None and path.exists():
            option = f"-XX:SharedArchiveFile={path} {QUIET}"
            out[DRIVER_OPTIONS] = f"{out.get(DRIVER_OPTIONS, '')} {option}".strip()
            used_marker(path).touch()
        elif path is not None and build:
            start_build(path)
    except OSError as exc:  # an unwritable cache, a vanished Java: start without
        log.debug("no archive of Spark's classes: %s", exc)
    return out


#: After a build that failed, sessions start no other for this long (`sluice spark archive`
#: still builds at once): a build that cannot succeed here costs its CPU once a day, not at
#: every session start.
RETRY_AFTER_SECONDS = 24 * 3600


def failed_marker(path: Path) -> Path:
    return path.with_suffix(".failed")


def recently_failed(path: Path) -> bool:
    try:
        return time.time() - failed_marker(path).stat().st_mtime < RETRY_AFTER_SECONDS
    except FileNotFoundError:
        return False


#: A build removes other installs' archives that no session mapped for this many days.
UNUSED_DAYS = 7


def used_marker(path: Path) -> Path:
    return path.with_suffix(".used")


def prune(path: Path, *, now: float | None = None) -> list[Path]:
    """Remove the archives (and their lock, log and marks) of installs other than `path`'s
    that no session mapped for `UNUSED_DAYS` days; returns the archives removed."""
    cutoff = (time.time() if now is None else now) - UNUSED_DAYS * 86400
    removed = []
    for other in path.parent.glob("*.jsa"):
        if other == path:
            continue
        marks = [used_marker(other), other]
        last = max((m.stat().st_mtime for m in marks if m.exists()), default=0.0)
        if last >= cutoff:
            continue
        for suffix in (".jsa", ".used", ".log", ".failed", ".lock"):
            other.with_suffix(suffix).unlink(missing_ok=True)
        removed.append(other)
    return removed


def start_build(path: Path) -> None:
    """Build the archive in a detached low-priority process, unless one is building it or a
    build failed less than `RETRY_AFTER_SECONDS` ago."""
    if recently_failed(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".log").open("ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "pipeline.spark.class_archive", str(path)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the session that started it, not its Ctrl-C
            env=_builder_environment(),
        )


def _builder_environment() -> dict[str, str]:
    """The Spark Connect server's environment (this interpreter and `pipeline` for the Python
    workers, Spark on loopback, no Spark Connect client mode), without submit arguments."""
    from pipeline.spark.connect import server_environment

    env = server_environment(token=None, host="127.0.0.1")
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    return env


def build(path: Path, *, wait: bool = False) -> bool:
    """Build the archive at `path`; False when another process is building it (`wait`:
    wait for that one, then return whether the archive exists)."""
    from pipeline.spark.connect import spark_home

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".lock").open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        if path.exists():
            return True
        for stale in path.parent.glob(f".{path.name}.*"):  # a builder killed mid-dump
            stale.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix="sluice-classes-") as work:
            staging = path.with_name(f".{path.name}.{os.getpid()}")
            staging.unlink(missing_ok=True)
            command = [
                str(spark_home() / "bin" / "spark-submit"),
                "--master", "local[2]",
                "--driver-java-options", f"-XX:ArchiveClassesAtExit={staging} {QUIET} {LOG4J}",
                str(Path(__file__).with_name("class_workload.py")),
                work,
            ]  # fmt: skip
            env = _builder_environment()
            with path.with_suffix(".log").open("ab") as out:
                done = subprocess.run(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, check=False
                )
            if done.returncode != 0 or not staging.exists() or staging.stat().st_size == 0:
                staging.unlink(missing_ok=True)
                failed_marker(path).touch()
                return False
            os.replace(staging, path)
            failed_marker(path).unlink(missing_ok=True)
            for gone in prune(path):
                log.info("removed the unused archive of another install: %s", gone)
            return True


if __name__ == "__main__":  # the background builder: python -m pipeline.spark.class_archive PATH
    os.nice(10)  # behind the jobs it is there to speed up
    sys.exit(0 if build(Path(sys.argv[1])) else 1)
