"""SIGKILL the mirror's driver at random points, restart it, and find every event exactly once.

Each life of the driver gets new events to copy (so there is always work in flight) and is
killed at a random moment: during start-up, while tasks write transactions, while the
driver records a batch's intent, commits the transactions or marks the batch done. After the
last kill the mirror runs to completion; the target stream must then hold every source event
exactly once, in the source's order for each routing key. Both commit modes of the sink are
killed: `tasks` (the embedded store's default) and `driver` (Pravega's, forced here), 20
kills per run between them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import pytest

from pipeline.streams import open_store
from tests.spark.killing import (
    Life,
    job_env,
    kill,
    kill_loop,
    run_to_completion,
    start,
    without_batch_limit,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

KEYS = 6


@pytest.mark.parametrize(("commit_mode", "kills"), [("tasks", 14), ("driver", 6)])
def test_mirror_driver_killed_at_random_points(tmp_path, commit_mode, kills):
    seed = int(os.environ.get("SLUICE_CRASH_SEED", "0")) or None
    edge, cloud = f"embedded:{tmp_path / 'edge'}", f"embedded:{tmp_path / 'cloud'}"
    with open_store(edge) as store:
        store.create_stream("edge/net", segments=2)
    counter = {"next": 0}

    def more_events(life: int) -> None:
        with open_store(edge) as store:
            for _ in range(3):  # three flushes: blocks the source can split between tasks
                with store.writer("edge/net") as writer:
                    for _ in range(15):
                        i = counter["next"]
                        counter["next"] += 1
                        payload = json.dumps({"key": f"k{i % KEYS}", "seq": i, "life": life})
                        writer.write(payload.encode(), routing_key=f"k{i % KEYS}")

    argv = [
        "--store", edge, "run", "mirror", "--stream", "edge/net", "--to", "cloud/net",
        "--to-store", cloud, "--max-events", "25", "--checkpoint", str(tmp_path / "ck"),
        "--commit-mode", commit_mode,
    ]  # fmt: skip
    env = job_env(tmp_path / "home")
    killed = kill_loop(argv, env, kills, more_events, seed)
    run_to_completion(without_batch_limit(argv), env)

    with open_store(edge) as source, open_store(cloud) as target:
        sent = [e.payload for e in source.read("edge/net")]
        copied = list(target.read("cloud/net"))
    assert killed >= kills
    assert len(sent) == counter["next"]
    received = [e.payload for e in copied]
    assert len(received) == len(set(received)), "an event was copied twice"
    assert sorted(received) == sorted(sent), "an event is missing"
    for key in {e.routing_key for e in copied}:
        order = [json.loads(e.payload)["seq"] for e in copied if e.routing_key == key]
        assert order == sorted(order), f"events of {key} were reordered"


@pytest.mark.parametrize("dies", ["before Spark plans batch 0", "before Spark commits batch 0"])
def test_a_mirror_from_tail_killed_in_its_first_batch_copies_every_event_after_its_start(
    tmp_path, dies
):
    """A driver killed on a new checkpoint, after it resolved `--from tail` and recorded the
    cut, before Spark planned or committed batch 0: the next run (same command line) starts
    from the recorded cut. It used to resolve `tail` again, and Spark re-ran batch 0 from the
    new tail: the events between the two tails were never copied."""
    edge, cloud, checkpoint = (
        f"embedded:{tmp_path / 'edge'}",
        f"embedded:{tmp_path / 'cloud'}",
        tmp_path / "ck",
    )
    written = []

    def more_events(count: int) -> None:
        with open_store(edge) as store, store.writer("edge/net") as writer:
            for _ in range(count):
                payload = json.dumps({"seq": len(written)}).encode()
                writer.write(payload, routing_key=f"k{len(written) % KEYS}")
                written.append(payload)

    with open_store(edge) as store:
        store.create_stream("edge/net")
    more_events(10)  # history: `--from tail` skips it
    history = len(written)
    argv = [
        "--store", edge, "run", "mirror", "--stream", "edge/net", "--to", "cloud/net",
        "--to-store", cloud, "--checkpoint", str(checkpoint), "--from", "tail",
        "--in-process-bytes", "0",
    ]  # fmt: skip
    env = job_env(tmp_path / "home")
    life = start([*argv, "--continuous", "--trigger", "200ms"], env)
    offsets, commits = checkpoint / "spark" / "offsets", checkpoint / "spark" / "commits"
    wait_for((checkpoint / "start_cut").exists, life)
    if dies == "before Spark plans batch 0":
        kill(life)
        more_events(30)
    else:
        more_events(30)
        wait_for((offsets / "0").exists, life)
        kill(life)
        assert not (commits / "0").exists(), "killed too late: batch 0 was committed"
    assert (offsets / "0").exists() == (dies == "before Spark commits batch 0")
    more_events(20)
    run_to_completion(argv, env)

    with open_store(cloud) as target:
        copied = [e.payload for e in target.read("cloud/net")]
    assert sorted(copied) == sorted(written[history:])


def wait_for(condition: Callable[[], bool], life: Life, timeout: float = 120.0) -> None:
    """Poll `condition` until it holds; fail if the driver ends first or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert life.proc.poll() is None, life.tail()
        assert time.monotonic() < deadline, life.tail()
        time.sleep(0.01)
