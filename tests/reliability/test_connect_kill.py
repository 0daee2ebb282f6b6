"""The warm Spark killed under a job: `kill -9` of the Spark Connect server (its process
group: the JVM and its Python workers) while a `sluice run mirror` or `sluice run export`
attached to it is between batches or in one. The run fails with one line that says what
happened and what to do; its rerun (no server now: a local Spark) goes on from the
checkpoint, and every event is mirrored, or exported, exactly once.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.spark.killing import kill, run_to_completion, start
from tests.spark.test_connect import (  # noqa: F401  (`server` is the fixture)
    append,
    assert_mirrored_once,
    exported_rows,
    job,
    server,
    server_log,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

EVENTS = 100


@pytest.mark.timeout(900)
@pytest.mark.parametrize("which", ["mirror", "export"])
def test_a_run_whose_server_is_killed_fails_in_one_line_and_its_rerun_is_exactly_once(
    tmp_path,
    server,  # noqa: F811
    which,
):
    home, env, state = server
    edge, cloud = f"embedded:{tmp_path / 'edge'}", f"embedded:{tmp_path / 'cloud'}"
    export = which == "export"
    append(edge, 0, EVENTS)
    if export:  # the export's input, mirrored by a local Spark
        run_to_completion(job(edge, cloud, tmp_path), {**env, "SLUICE_SPARK_REMOTE": "local"})

    life = start(job(edge, cloud, tmp_path, export=export, max_events=5), env)
    assert life.reported_a_batch(timeout=300), life.tail() + server_log(home)
    os.killpg(state.pid, signal.SIGKILL)
    deadline = time.monotonic() + 180
    while life.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if life.proc.poll() is None:
        kill(life)
        pytest.fail("the job did not stop after its Spark Connect server was killed")
    time.sleep(0.2)  # the pump's last lines
    stderr = "".join(life.stderr)
    assert life.proc.returncode == 1, life.tail()
    assert stderr.strip().splitlines()[-1] == (
        f"sluice: error: {which} job failed: the Spark Connect server at "
        f"sc://localhost:{state.port} stopped answering (killed, stopped or restarted): run the "
        "job again, it goes on from its checkpoint (on a local Spark if no server runs: "
        "`sluice spark status`)"
    ), life.tail()
    assert "RETRIES_EXCEEDED" not in stderr
    assert state.token not in stderr

    life = run_to_completion(job(edge, cloud, tmp_path, export=export), env)
    assert "attaching to Spark Connect" not in "".join(life.stderr)
    assert_mirrored_once(edge, cloud)
    if export:
        assert exported_rows(tmp_path / "out") == (EVENTS * 50, EVENTS * 50)
