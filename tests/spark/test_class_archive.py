"""The archive of Spark's classes (`pipeline/spark/class_archive.py`): used when there, built
when not, never in the way of a start.

The slow test builds the real archive with `sluice spark archive` (in the user's cache, where
every Spark of the test run then finds it; a no-op when a session already built it) and starts
a local session that maps it: Java's class-load log names where each class came from."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.spark.class_archive import (
    DRIVER_OPTIONS,
    QUIET,
    archive_path,
    build,
    failed_marker,
    prune,
    recently_failed,
    start_build,
    used_marker,
    with_archive,
)
from pipeline.spark.session import SparkSettings

ROOT = Path(__file__).resolve().parents[2]
JAVA = shutil.which("java")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sluice" / "spark-classes"


def test_the_setting_is_on_unless_turned_off():
    assert SparkSettings.from_config({}, environ={}).class_archive
    off = {"spark": {"class_archive": False}}
    assert not SparkSettings.from_config(off, environ={}).class_archive
    env = {"SLUICE_SPARK_CLASS_ARCHIVE": "false"}
    assert not SparkSettings.from_config({}, environ=env).class_archive


@pytest.mark.skipif(JAVA is None, reason="no java on PATH")
def test_the_key_names_the_java_and_spark_install(cache, tmp_path, monkeypatch):
    path = archive_path()
    assert path is not None and path.parent == cache and path.suffix == ".jsa"
    fake = tmp_path / "jdk"
    (fake / "bin").mkdir(parents=True)
    (fake / "release").write_text('JAVA_VERSION="17.0.1"\n')
    monkeypatch.setenv("JAVA_HOME", str(fake))
    first = archive_path()
    (fake / "release").write_text('JAVA_VERSION="17.0.2"\n')  # a JDK update: another archive
    assert len({path, first, archive_path()}) == 3


def test_a_reinstalled_spark_gets_another_archive(cache, tmp_path, monkeypatch):
    """The JVM maps an archive only while every jar keeps the time it had at the dump: a
    virtual environment installed again (same jars, new times) must not find the old one."""
    import pyspark

    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    jar = jars / "spark-core.jar"
    jar.write_bytes(b"classes")
    monkeypatch.setattr(pyspark, "__file__", str(jars.parent / "__init__.py"))
    first = archive_path()
    os.utime(jar, ns=(jar.stat().st_atime_ns, jar.stat().st_mtime_ns + 10**9))
    assert archive_path() != first


def test_a_build_removes_other_installs_archives_unused_for_a_week(cache):
    cache.mkdir(parents=True)
    now = time.time()
    mine, recent, used, old = (cache / f"{key}.jsa" for key in ("mine", "recent", "used", "old"))
    week_ago = now - 8 * 86400
    for archive in (mine, recent, used, old):
        archive.write_bytes(b"an archive")
        archive.with_suffix(".log").write_text("its log")
        os.utime(archive, (week_ago, week_ago))
    os.utime(recent, (now, now))
    used_marker(used).touch()
    assert prune(mine, now=now) == [old]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["mine.jsa", "mine.log", "recent.jsa", "recent.log", "used.jsa", "used.log", "used.used"]
    )


def test_an_existing_archive_is_mapped_by_the_driver(cache):
    path = archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"an archive")
    conf = with_archive({DRIVER_OPTIONS: "-Dmine=1", "spark.master": "local[2]"})
    assert conf[DRIVER_OPTIONS] == f"-Dmine=1 -XX:SharedArchiveFile={path} {QUIET}"
    assert conf["spark.master"] == "local[2]"
    assert used_marker(path).exists()  # a week without one and another install's build prunes it


def test_a_cache_that_cannot_be_written_starts_spark_without(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    conf = {DRIVER_OPTIONS: "-Dmine=1"}
    assert with_archive(conf) == conf


def test_one_builder_at_a_time(cache):
    path = archive_path()
    assert path is not None
    cache.mkdir(parents=True)
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert build(path) is False  # another builder holds it: this one leaves at once
    assert not path.exists()


@pytest.mark.skipif(JAVA is None, reason="no java on PATH")
def test_a_damaged_archive_never_stops_a_jvm_nor_speaks(tmp_path):
    damaged = tmp_path / "damaged.jsa"
    damaged.write_bytes(os.urandom(4096))
    done = subprocess.run(
        [JAVA, f"-XX:SharedArchiveFile={damaged}", *QUIET.split(), "-version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert "openjdk version" in done.stderr.lower() or "java version" in done.stderr.lower()
    assert "shared" not in done.stderr.lower() and "cds" not in done.stderr.lower()


@pytest.mark.slow
@pytest.mark.skipif(JAVA is None, reason="no java on PATH")
def test_sluice_spark_archive_builds_what_a_local_session_maps(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "pipeline.cli", "spark", "archive"]
    done = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout)
    assert built["status"] == "built" and Path(built["path"]).exists()
    assert built["path"] == str(archive_path())
    assert list(Path(built["path"]).parent.glob(".*")) == []  # no staging file left

    loads = tmp_path / "classes.log"
    session = (
        "from pipeline.spark.session import SparkSettings, spark_session\n"
        f"s = spark_session(SparkSettings(master='local[1]', remote='local', conf=("
        f"('spark.driver.extraJavaOptions', '-Xlog:class+load=info:file={loads}'),)))\n"
        "assert s.range(10).count() == 10\n"
    )
    started = subprocess.run(
        [sys.executable, "-c", session],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    spark_classes = [line for line in loads.read_text().splitlines() if "org.apache.spark." in line]
    from_archive = [line for line in spark_classes if "shared objects file (top)" in line]
    assert len(from_archive) > 0.5 * len(spark_classes) > 1000  # the rest: generated at run time


def test_a_failed_build_is_not_retried_by_every_session(cache, tmp_path, monkeypatch):
    broken = tmp_path / "jdk-without-java"
    (broken / "bin").mkdir(parents=True)
    monkeypatch.setenv("JAVA_HOME", str(broken))  # spark-submit cannot start a JVM
    path = archive_path()
    assert path is not None
    assert build(path) is False  # a real spark-submit, failing
    assert failed_marker(path).exists() and recently_failed(path) and not path.exists()
    log = path.with_suffix(".log")
    size = log.stat().st_size
    assert size > 0  # the failed spark-submit said why, as a retried build would again
    start_build(path)  # what a session does when the archive is missing: nothing, for a day
    time.sleep(3)  # a builder started anyway would have failed, and written, by now
    assert log.stat().st_size == size
    assert with_archive({DRIVER_OPTIONS: "-Dmine=1"}) == {DRIVER_OPTIONS: "-Dmine=1"}
