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

import pytest

from pipeline.streams import open_store
from tests.spark.killing import job_env, kill_loop, run_to_completion, without_batch_limit

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
