"""Sensors as pure functions of (cursor, resources, instance), through build_sensor_context."""

from __future__ import annotations

import uuid

import dagster as dg
import pytest
from dagster._core.storage.dagster_run import DagsterRun

from assets.definitions import build_resources
from assets.family import family_definitions
from assets.sensors import evaluate_tails
from assets.services import evaluate_services
from pipeline.jobs.mirror import mirror
from pipeline.jobs.runner import RunOptions
from tests.assets.conftest import head_text, samples, tail_text, write_events


def tails(context, settings) -> dg.SensorResult:
    return evaluate_tails(context, build_resources(settings)["stores"], settings.streams)


def test_tail_sensor_requests_a_catch_up_when_the_tail_moves(settings):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(2))
    resources = build_resources(settings)
    with dg.instance_for_test() as instance:
        first = tails(dg.build_sensor_context(instance=instance, resources=resources), settings)
        (request,) = first.run_requests  # the generator's stream does not exist yet
        assert request.job_name == "catch_up_network"
        assert request.tags == {"sluice/exclusive": "catch_up/network"}
        (observation,) = first.asset_events
        assert observation.asset_key == dg.AssetKey(["network", "edge_stream"])
        assert observation.tags["dagster/data_version"] == tail_text(net.store_uri, net.stream)

        same = dg.build_sensor_context(instance=instance, cursor=first.cursor, resources=resources)
        assert tails(same, settings).run_requests == []

        write_events(net.store_uri, net.stream, samples(1, first_event=2))
        moved = tails(
            dg.build_sensor_context(instance=instance, cursor=first.cursor, resources=resources),
            settings,
        )
        assert [r.job_name for r in moved.run_requests] == ["catch_up_network"]
        assert moved.run_requests[0].run_key != request.run_key

        # a catch-up run already running: no second one, and the cursor waits for it
        running = DagsterRun(
            job_name="catch_up_network",
            run_id=str(uuid.uuid4()),
            tags={"sluice/exclusive": "catch_up/network"},
            status=dg.DagsterRunStatus.STARTED,
        )
        instance.add_run(running)
        busy = tails(
            dg.build_sensor_context(instance=instance, cursor=first.cursor, resources=resources),
            settings,
        )
        assert busy.run_requests == []
        assert busy.cursor == first.cursor


@pytest.mark.spark
def test_service_progress_becomes_materializations(settings, spark):
    net = settings.family("network")
    watched = [w for w in family_definitions(net, settings).watched if w.job == "mirror"]
    checkpoint = watched[0].checkpoint
    write_events(net.store_uri, net.stream, samples(4))
    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance)
        assert evaluate_services(context, watched).asset_events == []  # nothing ran yet

        # what `sluice run mirror … --continuous` does each trigger, on the same checkpoint
        spec = family_mirror_spec(settings)
        mirror(spark, spec, RunOptions(checkpoint=checkpoint))
        (reported,) = evaluate_services(context, watched).asset_events
        meta = {k: v.value for k, v in reported.metadata.items()}
        first_end = tail_text(net.store_uri, net.stream)
        assert (meta["start_cut"], meta["end_cut"], meta["events"]) == (
            head_text(net.store_uri, net.stream),
            first_end,
            4,
        )
        assert meta["last_batch"] == 0
        assert "service" in meta["reported_by"]
        instance.report_runless_asset_event(reported)  # as the daemon stores a sensor's events
        assert evaluate_services(context, watched).asset_events == []

        write_events(net.store_uri, net.stream, samples(2, first_event=4))
        mirror(spark, spec, RunOptions(checkpoint=checkpoint))
        (later,) = evaluate_services(context, watched).asset_events
        meta = {k: v.value for k, v in later.metadata.items()}
        assert (meta["start_cut"], meta["events"], meta["last_batch"]) == (first_end, 2, 1)


def family_mirror_spec(settings):
    from assets.catch_up import FamilyJobs

    net = settings.family("network")
    return FamilyJobs.of(net, dict(settings.stores), settings.export_formats).mirror
