"""Re-runs from the UI with odd run config or after files were moved: a refusal that says
what to do, never a run that reports success while it did nothing (or something else)."""

from __future__ import annotations

import shutil

import pytest

from assets.catch_up import FamilyJobs
from assets.definitions import build_definitions
from tests.assets.conftest import materialized, samples, write_events
from tests.assets.test_catch_up import STREAMING, catch_up
from tests.assets.test_refusals import failures, retries


def test_a_damaged_export_file_fails_the_views_refresh_in_one_line(settings, instance):
    net = settings.family("network")
    hour = net.export_dir / "parquet" / "date=2026-11-01" / "hour=10"
    hour.mkdir(parents=True)
    (hour / "part-00000.parquet").write_bytes(b"")  # not whole Parquet
    job = build_definitions(settings).resolve_job_def("refresh_analytics")
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    (message,) = failures(result)
    assert message.rstrip().endswith(
        f": export network: {hour / 'part-00000.parquet'} is not a whole Parquet file (0 bytes)"
        ": an export publishes whole files only, so it was damaged or put there by something "
        f"else; move it out of {net.export_dir / 'parquet'} (or restore it from a copy) and "
        "refresh again"
    )


def test_run_config_naming_other_stores_is_refused_before_the_job_runs(
    settings, instance, tmp_path
):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(2))
    other = f"embedded:{tmp_path / 'other-edge'}"
    config = {"resources": {"stores": {"config": {"uris": {**settings.stores, "edge": other}}}}}
    job = build_definitions(settings).resolve_job_def("catch_up_network")
    result = job.execute_in_process(instance=instance, run_config=config, raise_on_error=False)
    assert retries(result) == 0
    (message,) = failures(result)
    expected = (
        f"the stores resource's run config sets {other!r} as stores.uris.edge, but the mirror "
        f"of network uses {net.store_uri!r} ([stores.edge] of sluice.toml), as do its "
        "checkpoint and its service: change [stores.edge] in sluice.toml and reload the code "
        "location, or launch the run without that resource config"
    )
    assert message.rstrip().endswith(f": {expected}")
    assert materialized(result) == {}
    mirror = FamilyJobs.of(net, dict(settings.stores), settings.export_formats).checkpoint("mirror")
    assert not mirror.exists()  # nothing ran: the mirror's checkpoint was never made


@pytest.mark.spark
@pytest.mark.slow
def test_an_export_whose_files_were_deleted_refuses_to_go_on(settings, instance, spark):
    """Deleting (or moving) an export's output directory leaves its checkpoint where it
    stood: a re-run would find nothing new and report all well, with the files gone for good.
    It is refused, saying how to export again; once the checkpoint is gone too, it does."""
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(5))
    first = materialized(catch_up(settings, instance))
    assert first["network/parquet_export"]["dagster/row_count"] == 50

    moved = net.export_dir.with_name("moved-away")
    shutil.move(net.export_dir, moved)
    # the exports materialized on their own (the mirror, idle, would skip them)
    again = catch_up(settings, instance, STREAMING[1:], raise_on_error=False)
    assert retries(again) == 0
    (message,) = failures(again)
    checkpoint = FamilyJobs.of(net, dict(settings.stores), settings.export_formats).checkpoint(
        "export"
    )
    expected = (
        f"export to {net.export_dir}: none of the 1 parquet files its checkpoint {checkpoint} "
        "published is there any more (deleted, or the directory moved): move them back, or, "
        f"to export the stream again from its start, delete {net.export_dir} and that checkpoint"
    )
    assert expected in message, message

    shutil.rmtree(checkpoint)  # what the message says: the export starts over
    later = materialized(catch_up(settings, instance, STREAMING[1:]))
    assert later["network/parquet_export"]["dagster/row_count"] == 50


def test_an_analytics_home_other_than_the_sluice_home_is_refused(settings, instance, tmp_path):
    """The exports would be read from the Sluice home and the lineage and replays from the
    configured one: the views would lose those rows without a word."""
    elsewhere = tmp_path / "elsewhere"
    config = {"home": str(elsewhere), "database": str(elsewhere / "sluice.duckdb")}
    job = build_definitions(settings).resolve_job_def("refresh_analytics")
    result = job.execute_in_process(
        instance=instance,
        run_config={"resources": {"analytics": {"config": config}}},
        raise_on_error=False,
    )
    (message,) = failures(result)
    expected = (
        f"the analytics resource's run config sets home {str(elsewhere)!r}, but the exports, "
        f"slices, lineage and replays of this code location are under {str(settings.home)!r} "
        "(SLUICE_HOME): a refresh would read half of them; set `database` alone to write the "
        "database elsewhere, or change SLUICE_HOME and reload the code location"
    )
    assert message.rstrip().endswith(f": {expected}")
    assert not (elsewhere / "sluice.duckdb").exists()


def test_an_analytics_database_elsewhere_is_built_there(settings, instance, tmp_path):
    database = tmp_path / "elsewhere" / "sluice.duckdb"
    config = {"home": str(settings.home), "database": str(database)}
    job = build_definitions(settings).resolve_job_def("refresh_analytics")
    result = job.execute_in_process(
        instance=instance, run_config={"resources": {"analytics": {"config": config}}}
    )
    assert result.success and database.exists()
