"""`sluice run console … | head`: the reader of the job's output goes away mid-batch.

The job runs as a real `sluice` process, its standard output a pipe whose reader has gone, as
after `| head` (`pipeline/jobs/console.py`). It ends quietly with 141, in Spark (the query
stopped after the batch, no py4j or Java traceback) and in this process (a small backlog), and
the batch it was printing is left undone: the next run prints it again, from its first event.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.streams import open_store
from tests.spark.killing import ROOT, job_env

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]

STREAM = "edge/net"


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """Spark's quick test JVM; standard output buffered, as an operator's shell has it."""
    env = job_env(tmp_path / "home")
    env.pop("PYTHONUNBUFFERED", None)
    return env


def append(store: str, first: int, count: int) -> None:
    with open_store(store) as opened, opened.writer(STREAM) as writer:
        for i in range(first, first + count):
            writer.write(b"event %d" % i)


def console(store: str, checkpoint: str, *flags: str) -> list[str]:
    return [
        sys.executable, "-m", "pipeline.cli", "--store", store, "run", "console",
        "--stream", STREAM, "--checkpoint", checkpoint, *flags,
    ]  # fmt: skip


def with_reader_gone(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The exit status and standard error of `argv` run with `| head -0` on its output."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        proc = subprocess.run(
            argv, stdout=writer, stderr=subprocess.PIPE, env=env, cwd=ROOT, timeout=300, check=False
        )
    finally:
        os.close(writer)
    return proc.returncode, proc.stderr.decode()


def printed(argv: list[str], env: dict[str, str]) -> list[str]:
    """The events a run to the end prints (their payloads)."""
    proc = subprocess.run(argv, capture_output=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return [line.rsplit("  ", 1)[1] for line in proc.stdout.decode().splitlines()]


def assert_quiet(status: int, err: str) -> None:
    assert status == 141, err
    for noise in ("Traceback", "py4j", "Exception", "ERROR", "sluice: "):
        assert noise not in err, err


@pytest.fixture
def store(tmp_path) -> str:
    """A stream of 1,000 events."""
    uri = f"embedded:{tmp_path / 'store'}"
    with open_store(uri) as opened:
        opened.create_stream(STREAM)
    append(uri, 0, 1000)
    return uri


def test_in_spark_the_query_stops_quietly_and_the_batch_is_printed_again(tmp_path, env, store):
    """A continuous run: it stops by itself once the reader has gone."""
    checkpoint = str(tmp_path / "ck")
    flags = ("--continuous", "--trigger", "1s", "--in-process-bytes", "0")
    status, err = with_reader_gone(console(store, checkpoint, *flags), env)
    assert_quiet(status, err)
    assert "starting Spark" in err
    again = printed(console(store, checkpoint, "--in-process-bytes", "0"), env)
    assert again == [f"event {i}" for i in range(1000)]


def test_in_this_process_the_run_ends_quietly_and_the_batch_is_printed_again(tmp_path, env, store):
    """A small backlog on a settled checkpoint: no Spark for it, and none after it either."""
    checkpoint = str(tmp_path / "ck")
    assert len(printed(console(store, checkpoint, "--in-process-bytes", "0"), env)) == 1000
    append(store, 1000, 10)
    small = ("--in-process-bytes", "1000000")
    status, err = with_reader_gone(console(store, checkpoint, *small), env)
    assert_quiet(status, err)
    assert "starting Spark" not in err
    again = printed(console(store, checkpoint, *small), env)
    assert again == [f"event {i}" for i in range(1000, 1010)]
