"""The nightly replay schedule as a pure function of the instance: stale slices first, else a
revalidation of the oldest replay; slices with a replay run in flight are left to that run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import dagster as dg
from dagster._core.storage.dagster_run import DagsterRun

from assets.schedules import evaluate_nightly

REPLAY = dg.AssetKey(["network", "replay_nic_throughput"])
TICK = datetime(2026, 11, 23, 3, 0, tzinfo=UTC)


def replayed(instance: dg.DagsterInstance, partition: str, version: str) -> str:
    """Record a replay of `partition` at code `version`; the id of the run that recorded it."""
    instance.report_runless_asset_event(
        dg.AssetMaterialization(REPLAY, partition=partition, tags={"dagster/code_version": version})
    )
    found = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=REPLAY, asset_partitions=[partition]), limit=1
    )
    return found.records[0].run_id


def nightly(instance: dg.DagsterInstance, family, version: str):
    context = dg.build_schedule_context(instance=instance, scheduled_execution_time=TICK)
    return evaluate_nightly(context, family, {REPLAY: version})


def test_stale_slices_first_then_the_oldest_replay_is_revalidated(settings):
    net = settings.family("network")
    with dg.instance_for_test() as instance:
        assert isinstance(nightly(instance, net, "v2"), dg.SkipReason)  # no slices yet
        instance.add_dynamic_partitions("network_slices", ["sl-a", "sl-b", "sl-c"])
        oldest_run = replayed(instance, "sl-a", "v2")
        replayed(instance, "sl-b", "v2")

        (never,) = nightly(instance, net, "v2")  # sl-c was never replayed
        assert (never.partition_key, never.job_name) == ("sl-c", "replay_network")
        assert never.tags == {"sluice/replay_reason": "stale"}

        # the new-slices sensor's run of sl-c is running: left to it, sl-a is revalidated
        running = DagsterRun(
            job_name="replay_network",
            run_id=str(uuid.uuid4()),
            tags={"dagster/partition": "sl-c"},
            status=dg.DagsterRunStatus.STARTED,
        )
        instance.add_run(running)
        (check,) = nightly(instance, net, "v2")
        assert check.partition_key == "sl-a"
        assert check.tags == {
            "sluice/replay_reason": "revalidate",
            "sluice/revalidates": oldest_run,
        }
        assert check.run_key == f"revalidate:sl-a:{TICK.isoformat()}"

        # once sl-a is replayed again, sl-b is the oldest
        replayed(instance, "sl-a", "v2")
        (next_check,) = nightly(instance, net, "v2")
        assert next_check.partition_key == "sl-b"

        # a new model version makes every replayed slice stale (sl-c is still in flight)
        changed = nightly(instance, net, "v3")
        assert sorted(r.partition_key for r in changed) == ["sl-a", "sl-b"]
        assert {r.tags["sluice/replay_reason"] for r in changed} == {"stale"}


def test_a_slice_that_fails_its_revalidation_does_not_take_every_night(settings):
    """A slice whose history no longer replays (its stream truncated, a block damaged) fails
    its revalidation: the next nights check the other slices, then it again."""
    net = settings.family("network")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("network_slices", ["sl-a", "sl-b", "sl-c"])
        for partition in ("sl-a", "sl-b", "sl-c"):
            replayed(instance, partition, "v2")
        turns = []
        for _ in range(4):
            (check,) = nightly(instance, net, "v2")
            turns.append(check.partition_key)
            tags = {**check.tags, "dagster/partition": check.partition_key}
            failed = DagsterRun(
                job_name="replay_network",
                run_id=str(uuid.uuid4()),
                tags=tags,
                status=dg.DagsterRunStatus.FAILURE,
            )
            instance.add_run(failed)  # no replay recorded: the revalidation failed
        assert turns == ["sl-a", "sl-b", "sl-c", "sl-a"]
