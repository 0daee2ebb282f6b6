"""Edges of the Dagster definitions: what is missing or misconfigured is refused at once, with
a reason that names it (a run fails without retries, a resource when it is built, a check
passes with a note, a sensor tick skips saying why), never a retried traceback."""

from __future__ import annotations

import re

import dagster as dg
import pytest
from pydantic import ValidationError

from assets.definitions import build_definitions, build_resources
from assets.family import family_definitions
from assets.sensors import evaluate_slices, evaluate_tails
from assets.services import evaluate_services
from resources import StreamStoresResource
from tests.assets.conftest import mirror_lag_evaluation, samples, write_events


def failures(result: dg.ExecuteInProcessResult) -> list[str]:
    """The descriptions of the run's failed steps."""
    return [
        e.event_specific_data.error.message
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    ]


def retries(result: dg.ExecuteInProcessResult) -> int:
    return sum(e.event_type_value == "STEP_UP_FOR_RETRY" for e in result.all_events)


def test_a_replay_of_a_slice_that_is_gone_fails_at_once_saying_so(settings, instance):
    instance.add_dynamic_partitions("network_slices", ["gone"])
    job = build_definitions(settings).resolve_job_def("replay_network")
    result = job.execute_in_process(instance=instance, partition_key="gone", raise_on_error=False)
    assert retries(result) == 0  # a retry cannot bring the slice back
    (message,) = failures(result)
    assert "no slice 'gone' in sluice/slices" in message


def test_a_catch_up_before_the_edge_stream_exists_fails_at_once_saying_so(settings, instance):
    job = build_definitions(settings).resolve_job_def("catch_up_network")
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    assert retries(result) == 0
    (message,) = failures(result)
    assert "stream examples/network does not exist" in message


def test_the_mirror_lag_check_passes_with_a_note_before_the_edge_stream_exists(settings, instance):
    evaluation = mirror_lag_evaluation(settings, instance)
    assert evaluation.passed
    note = evaluation.metadata["note"].value
    assert note == "examples/network does not exist yet: nothing to mirror"


def test_a_store_uri_that_does_not_parse_is_refused_when_the_resource_is_built(settings, instance):
    expected = "stores.uris.cloud: 'cloud-1' is not a store URI"
    with pytest.raises(ValidationError, match=re.escape(expected)):
        StreamStoresResource(uris={"cloud": "cloud-1"})

    job = build_definitions(settings).resolve_job_def("catch_up_network")
    bad = {"resources": {"stores": {"config": {"uris": {"edge": "edge:1"}}}}}
    result = job.execute_in_process(instance=instance, run_config=bad, raise_on_error=False)
    (failure,) = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    assert "stores.uris.edge: 'edge:1' is not a store URI" in str(failure.event_specific_data)
    assert not [e for e in result.all_events if e.event_type_value == "STEP_START"]


def test_sensors_skip_saying_why_when_a_store_cannot_be_opened(settings, instance, tmp_path):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    stores = StreamStoresResource(
        uris={"edge": f"embedded:{in_the_way}", "cloud": f"embedded:{in_the_way}"}
    )
    context = dg.build_sensor_context(instance=instance)
    tails = evaluate_tails(context, stores, settings.streams)
    assert tails.run_requests == []
    assert f"network: stream store embedded:{in_the_way} is unavailable" in (
        tails.skip_reason.skip_message
    )
    slices = evaluate_slices(context, stores, [settings.family("network")])
    assert slices.run_requests == []
    assert f"network: stream store embedded:{in_the_way} is unavailable" in (
        slices.skip_reason.skip_message
    )


def test_a_sensor_tick_without_work_says_why(settings, instance):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(1))
    stores = build_resources(settings)["stores"]
    first = evaluate_tails(dg.build_sensor_context(instance=instance), stores, [net])
    again = dg.build_sensor_context(instance=instance, cursor=first.cursor)
    assert evaluate_tails(again, stores, [net]).skip_reason.skip_message == (
        "no edge tail moved since the last run request"
    )
    slices = evaluate_slices(dg.build_sensor_context(instance=instance), stores, [net])
    assert slices.skip_reason.skip_message == "network: no slices yet (sluice/slices)"


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [("not json", "is not JSON"), ('{"version": 7, "tails": {}}', "has version 7, not 1")],
)
def test_a_cursor_that_cannot_be_read_skips_the_tick_saying_how_to_reset_it(
    settings, instance, cursor, reason
):
    defs = build_definitions(settings)
    sensor = defs.resolve_sensor_def("edge_tail_sensor")
    resources = build_resources(settings)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources) as context:
        result = sensor.evaluate_tick(context)
    assert result.run_requests == []
    assert result.skip_message == (
        f"the sensor's cursor {cursor!r} {reason}: reset the sensor's cursor in the UI"
    )


def test_an_analytics_home_that_cannot_be_written_fails_saying_where(settings, instance, tmp_path):
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    home = in_the_way / "home"
    analytics = {"home": str(home), "database": str(home / "analytics" / "sluice.duckdb")}
    job = build_definitions(settings).resolve_job_def("refresh_analytics")
    result = job.execute_in_process(
        instance=instance,
        run_config={"resources": {"analytics": {"config": analytics}}},
        raise_on_error=False,
    )
    (message,) = failures(result)
    assert (
        f"analytics directory {home / 'analytics'}: {in_the_way} is a regular file, "
        "not a directory; choose another analytics directory, or move that file away"
    ) in message


def test_a_damaged_checkpoint_keeps_back_only_its_own_service_progress(settings, instance):
    family = family_definitions(settings.family("network"), settings)
    mirror, export = family.watched[:2]
    (mirror.checkpoint / "spark" / "commits").mkdir(parents=True)
    (mirror.checkpoint / "spark" / "commits" / "0").write_text("v1\n{}\n")  # no offsets
    context = dg.build_sensor_context(instance=instance)
    result = evaluate_services(context, [mirror, export])
    assert result.asset_events == []
    assert result.skip_reason.skip_message.startswith(
        f"mirror/network: cannot read the progress of checkpoint {mirror.checkpoint}: "
    )
