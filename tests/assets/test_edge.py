"""The edge stream is observed: its tail cut is its data version, and it moves with the tail."""

from __future__ import annotations

import dagster as dg

from assets.definitions import build_definitions
from pipeline.streams import open_store


def observe(settings, instance) -> dg.ExecuteInProcessResult:
    job = build_definitions(settings).resolve_job_def("observe_edge_streams")
    return job.execute_in_process(instance=instance, raise_on_error=False)


def observations(result: dg.ExecuteInProcessResult) -> dict[str, dg.AssetObservation]:
    found = {}
    for event in result.all_events:
        if event.event_type_value == "ASSET_OBSERVATION":
            obs = event.event_specific_data.asset_observation
            found[obs.asset_key.to_user_string()] = obs
    return found


def write_events(uri: str, stream: str, payloads: list[bytes]) -> None:
    with open_store(uri) as store:
        store.create_stream(stream)
        with store.writer(stream) as writer:
            for payload in payloads:
                writer.write(payload)


def test_tail_cut_is_the_data_version(settings, instance):
    for family in settings.streams:
        write_events(family.store_uri, family.stream, [b"one", b"two"])
    first = observations(observe(settings, instance))
    net = settings.family("network")
    with open_store(net.store_uri) as store:
        tail = store.tail(net.stream)
    obs = first["network/edge_stream"]
    assert obs.tags["dagster/data_version"] == tail.text
    assert obs.metadata["events"].value == 2
    assert obs.metadata["tail"].value == tail.text

    write_events(net.store_uri, net.stream, [b"three"])
    second = observations(observe(settings, instance))
    assert second["network/edge_stream"].tags["dagster/data_version"] != tail.text
    assert second["network/edge_stream"].metadata["events"].value == 3
    unchanged = "generator/edge_stream"
    assert (
        second[unchanged].tags["dagster/data_version"]
        == first[unchanged].tags["dagster/data_version"]
    )


def test_a_missing_edge_stream_fails_and_says_how_to_start_it(settings, instance):
    result = observe(settings, instance)
    assert not result.success
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    text = " ".join(str(e.event_specific_data.error) for e in failures)
    assert "does not exist" in text
    assert "sluice collect" in text
