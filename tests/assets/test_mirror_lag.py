"""The mirror's lag counts what a scale added: events written to segments created after the
mirror's committed position are behind it too (they counted as no lag at all)."""

from __future__ import annotations

import dagster as dg
import pytest

from assets.definitions import build_definitions, build_resources
from pipeline.streams import open_store
from tests.assets.conftest import materialized, mirror_lag_evaluation, samples, write_events

pytestmark = pytest.mark.spark


def test_the_lag_counts_the_segments_a_scale_created_since_the_mirrors_position(
    settings, instance, spark
):
    net = settings.family("network")
    write_events(net.store_uri, net.stream, samples(5))
    defs = build_definitions(settings)
    mirrored = dg.materialize(
        [a for a in defs.assets if isinstance(a, dg.AssetsDefinition)],
        selection=dg.AssetSelection.assets(dg.AssetKey.from_user_string("network/cloud_mirror")),
        instance=instance,
        resources=build_resources(settings),
    )
    assert materialized(mirrored)["network/cloud_mirror"]["lag_bytes"] == 0

    with open_store(net.store_uri) as store:
        (old,) = store.tail(net.stream).segments
        store.split_segment(net.stream, old, 2)
        before = store.tail(net.stream).segments
        write_events(net.store_uri, net.stream, samples(3, first_event=5))
        after = store.tail(net.stream).segments
    added = sum(after[seg] - before[seg] for seg in after)
    assert added > 0

    evaluation = mirror_lag_evaluation(settings, instance)
    assert evaluation.metadata["lag_bytes"].value == added
