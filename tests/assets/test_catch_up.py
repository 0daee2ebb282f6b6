"""The mirror and exports as Dagster assets: catch-up runs with cut ranges, counts, lag,
schema and paths as metadata; a run that finds the continuous service running skips; a run
that finds nothing new observes so without starting Spark, and the next new events are
materialized once."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.catch_up import FamilyJobs
from assets.definitions import build_definitions, build_resources
from pipeline.jobs.checkpoint import Checkpoint
from pipeline.jobs.mirror import mirror_identity
from tests.assets.conftest import head_text, materialized, samples, tail_text, write_events

pytestmark = pytest.mark.spark

STREAMING = ["network/cloud_mirror", "network/parquet_export", "network/csv_export"]


def catch_up(settings, instance, keys=STREAMING, **kwargs) -> dg.ExecuteInProcessResult:
    """Materialize `keys` (the mirror and the exports) as a catch-up run does."""
    defs = build_definitions(settings)
    selection = dg.AssetSelection.assets(*(dg.AssetKey.from_user_string(k) for k in keys))
    return dg.materialize(
        [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)],
        selection=selection,
        instance=instance,
        resources=build_resources(settings),
        **kwargs,
    )


def test_catch_up_records_cut_ranges_counts_and_schema(settings, instance, spark, monkeypatch):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, [*samples(5), b"not json"])
    first = materialized(catch_up(settings, instance))
    assert set(first) == set(STREAMING)

    mirror = first["network/cloud_mirror"]
    edge_tail = tail_text(net.store_uri, net.stream)
    # A new checkpoint reports the explicit cut it started from, not the word "head".
    assert mirror["start_cut"] == head_text(net.store_uri, net.stream)
    assert mirror["end_cut"] == edge_tail
    assert (mirror["events"], mirror["lag_bytes"]) == (6, 0)
    assert mirror["target_stream"] == net.mirror_stream
    assert mirror["spark_started"] is True  # a new checkpoint's first batch is Spark's

    parquet = first["network/parquet_export"]
    cloud_tail = tail_text(net.mirror_store_uri, net.mirror_stream)
    assert parquet["end_cut"] == cloud_tail
    assert (parquet["events"], parquet["rows"], parquet["quarantined"]) == (6, 50, 1)
    assert parquet["dagster/row_count"] == 50
    assert parquet["quarantine_rate"] == pytest.approx(1 / 6)
    columns = [c.name for c in parquet["dagster/column_schema"].columns]
    assert columns[:5] == ["RemoteAddr", "Interface", "TimestampNanos", "RxBytes", "TxBytes"]
    assert {"_segment", "_offset", "_sample"} <= set(columns)
    described = {c.name: c.description for c in parquet["dagster/column_schema"].columns}
    assert described["RxBytes"].startswith("bytes received") and all(described.values())
    assert all(c.description for c in parquet["quarantine_schema"].columns)
    assert parquet["output"] == str(net.export_dir / "parquet")
    assert parquet["files"] >= 1 and parquet["bytes"] > 0
    assert first["network/csv_export"]["output"] == str(net.export_dir / "csv")

    version = instance.get_latest_data_version_record(dg.AssetKey(["network", "cloud_mirror"]))
    assert version is not None

    write_events(net.store_uri, net.stream, samples(3, first_event=5))
    monkeypatch.setenv("SLUICE_IN_PROCESS_BYTES", str(1 << 20))  # a small backlog: no Spark
    second = materialized(catch_up(settings, instance))
    assert {second[key]["spark_started"] for key in STREAMING} == {False}
    assert second["network/cloud_mirror"]["start_cut"] == edge_tail
    assert second["network/cloud_mirror"]["end_cut"] == tail_text(net.store_uri, net.stream)
    assert second["network/cloud_mirror"]["events"] == 3
    assert second["network/parquet_export"]["start_cut"] == cloud_tail
    assert second["network/parquet_export"]["dagster/row_count"] == 80


def test_a_run_that_finds_the_service_running_says_so_and_skips(settings, instance, spark):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(2))
    jobs = FamilyJobs.of(net, dict(settings.stores), settings.export_formats)
    # what `sluice run mirror` holds
    with Checkpoint(jobs.checkpoint("mirror"), mirror_identity(jobs.mirror)):
        result = catch_up(settings, instance)
    assert result.success
    assert "network/cloud_mirror" not in materialized(result)
    observed = [
        e.event_specific_data.asset_observation
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    ]
    skipped = {o.asset_key.to_user_string(): o.metadata["skipped"].value for o in observed}
    assert "the checkpoint is held by another run" in skipped["network/cloud_mirror"]
    assert "--continuous" in skipped["network/cloud_mirror"]


def test_a_run_that_finds_nothing_new_observes_instead_of_materializing(settings, instance, spark):
    """An idle catch-up records an observation, never an empty materialization; its steps
    downstream and the checks are skipped (Dagster's skip), so the latest materialization and
    the latest completed check evaluations still describe the data as it stands."""
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(3))
    job = build_definitions(settings).resolve_job_def("catch_up_network")
    first = job.execute_in_process(instance=instance)
    parquet = dg.AssetKey(["network", "parquet_export"])
    again = job.execute_in_process(instance=instance)

    assert again.success
    assert materialized(again) == {}
    observed = {
        e.event_specific_data.asset_observation.asset_key.to_user_string(): {
            k: v.value for k, v in e.event_specific_data.asset_observation.metadata.items()
        }
        for e in again.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
    }
    mirror = observed["network/cloud_mirror"]
    end_cut = materialized(first)["network/cloud_mirror"]["end_cut"]
    assert mirror["skipped"] == f"no new events since {end_cut}"
    assert (mirror["end_cut"], mirror["lag_bytes"]) == (end_cut, 0)
    assert mirror["spark_started"] is False  # decided from the checkpoint and the store
    assert instance.get_latest_materialization_event(parquet).run_id == first.run_id
    assert {e.step_key for e in again.all_events if e.event_type_value == "STEP_SKIPPED"} == {
        "export_network",
        "network__slices",
        "check_network_export",
        "network__cloud_mirror_mirror_lag",
    }
    storage = instance.event_log_storage
    for name in ("no_duplicate_samples", "quarantine_rate", "no_sample_gaps"):
        records = storage.get_asset_check_execution_history(dg.AssetCheckKey(parquet, name), 2)
        skipped, passed = records  # newest first
        assert skipped.run_id == again.run_id  # planned, not run: resolved as skipped
        assert skipped.status.value == "PLANNED"
        assert passed.status.value == "SUCCEEDED"
        target = passed.event.dagster_event.event_specific_data.target_materialization_data
        assert target.run_id == first.run_id

    # The events after an idle run are materialized, once.
    write_events(net.store_uri, net.stream, samples(2, first_event=3))
    later = materialized(job.execute_in_process(instance=instance))
    assert later["network/cloud_mirror"]["start_cut"] == end_cut
    assert later["network/cloud_mirror"]["events"] == 2
    assert later["network/parquet_export"]["dagster/row_count"] == 50
