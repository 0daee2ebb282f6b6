"""The whole family in Dagster: catch up, slices -> partitions (the sensor), a replay per slice
with its determinism check, the nightly schedule after a model change, the analytics views."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.definitions import build_definitions, build_resources
from assets.schedules import evaluate_nightly
from assets.sensors import evaluate_slices
from pipeline.jobs.slices import list_slices
from pipeline.streams import open_store
from tests.assets.conftest import materialized, nic_events, write_events

pytestmark = pytest.mark.spark

QUIET, BURST = 1000, 100_000  # bytes per 0.1 s sample: 0.08 and 8 Mbit/s
REPLAY = dg.AssetKey(["network", "replay_nic_throughput"])


def checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {
        e.event_specific_data.asset_check_key.name: e.event_specific_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }


def test_slices_replays_schedule_and_views(settings, spark, monkeypatch):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, nic_events([QUIET, BURST, BURST, QUIET, BURST, QUIET]))
    defs = build_definitions(settings)
    resources = build_resources(settings)
    with dg.instance_for_test() as instance:
        caught_up = defs.resolve_job_def("catch_up_network").execute_in_process(instance=instance)
        assert checks(caught_up) == {
            "mirror_lag": True,
            "no_duplicate_samples": True,
            "quarantine_rate": True,
            "no_sample_gaps": True,
        }
        slices = materialized(caught_up)["network/slices"]
        assert (slices["slices"], slices["new_slices"]) == (2, 2)

        # the sensor: two new slices -> two partitions, two replay runs; then nothing new
        context = dg.build_sensor_context(instance=instance, resources=resources)
        first = evaluate_slices(context, resources["stores"], [net])
        with open_store(net.mirror_store_uri) as store:
            records = list_slices(store, net.mirror_stream, net.bookmark.slices_stream)
        ids = [r.slice_id for r in records]
        assert [r.partition_key for r in first.run_requests] == ids
        assert {r.job_name for r in first.run_requests} == {"replay_network"}
        assert first.dynamic_partitions_requests[0].partition_keys == ids
        instance.add_dynamic_partitions("network_slices", ids)
        again = dg.build_sensor_context(instance=instance, cursor=first.cursor, resources=resources)
        assert evaluate_slices(again, resources["stores"], [net]).run_requests == []

        # a replay per slice, tagged with the model's code version, checked for determinism
        replay_job = defs.resolve_job_def("replay_network")
        runs, outputs = {}, {}
        for record in records:
            run = replay_job.execute_in_process(instance=instance, partition_key=record.slice_id)
            assert checks(run) == {"replay_is_deterministic": True}
            meta = materialized(run)["network/replay_nic_throughput"]
            assert (meta["start_cut"], meta["end_cut"]) == (record.start_cut, record.end_cut)
            assert meta["slice_id"] == record.slice_id
            assert meta["input_rows"] > 0 and meta["output_rows"] > 0
            version = defs.resolve_assets_def(REPLAY).code_versions_by_key[REPLAY]
            # the asset's code version is the replay's identity: model version + parameters
            assert version == f"{meta['model_version']}+params-{meta['params_hash'][7:23]}"
            assert meta["params"] == {"burst_mbps": 5.0, "idle_mbps": 0.01}
            runs[record.slice_id], outputs[record.slice_id] = meta["run_id"], meta["output_rows"]

        # nightly: nothing stale, so the oldest replay is revalidated; after a change to the
        # model, every slice is stale
        schedule_context = dg.build_schedule_context(instance=instance)
        nightly = defs.resolve_schedule_def("nightly_replays_network")
        assert nightly.cron_schedule == settings.dagster.replay_schedule
        (revalidate,) = nightly(schedule_context)
        assert revalidate.partition_key == ids[0]
        assert revalidate.tags["sluice/replay_reason"] == "revalidate"
        from pipeline.models import nic

        monkeypatch.setattr(nic.throughput, "version", "changed-in-test", raising=False)
        changed = build_definitions(settings).resolve_assets_def(REPLAY)
        new_version = changed.code_versions_by_key[REPLAY]
        assert new_version.startswith("changed-in-test+params-")
        stale = evaluate_nightly(schedule_context, net, {REPLAY: new_version})
        assert sorted(r.partition_key for r in stale) == sorted(ids)
        monkeypatch.undo()

        # replaying a slice again is the same replay: no new lineage, no new result rows
        again = replay_job.execute_in_process(instance=instance, partition_key=ids[0])
        assert materialized(again)[REPLAY.to_user_string()]["run_id"] == runs[ids[0]]

        # the analysts' views, with the NIC rate plot
        views = defs.resolve_job_def("refresh_analytics").execute_in_process(instance=instance)
        meta = materialized(views)["analytics/duckdb_views"]
        assert meta["rows/samples"] == 60
        assert meta["rows/slices"] == 2
        assert meta["rows/lineage"] == 2  # one per slice, the re-run included
        assert meta["rows/replays"] == sum(outputs.values())  # one row per result row
        assert meta["rows/slice_rows"] > 0
        plot = meta["rate_plot/network"]
        assert plot.endswith(".png")
        assert meta["rate_plot_image/network"].startswith("![network rx/tx Mbit/s](data:image/png")
