"""Scales a stream cannot take are refused before anything changes: more active segments than
a stream may have, and key ranges that are no numbers."""

from __future__ import annotations

import re

import pytest

from pipeline.streams import InvalidArgument


def test_a_split_past_the_most_segments_a_stream_has_is_refused(store):
    store.create_stream("sc/many", segments=1000)
    before = store.head("sc/many")
    message = (
        "invalid number of new segments 30: sc/many has 1000 active segments, and a stream"
        " has at most 1024: split into fewer parts, or merge cold segments first"
    )
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        store.split_segment("sc/many", 0, 30)
    assert store.head("sc/many") == before, "no segment was sealed or created"
    assert len(store.split_segment("sc/many", 0, 25)) == 25  # exactly 1024 active


def test_key_ranges_that_are_not_numbers_are_refused(store):
    store.create_stream("sc/nan")
    nan = float("nan")
    with pytest.raises(InvalidArgument, match=re.escape("invalid key ranges [(nan, nan)]")):
        store.scale("sc/nan", [0], [(nan, nan)])
    with pytest.raises(InvalidArgument, match=re.escape("invalid key ranges")):
        store.scale("sc/nan", [0], [(0.0, nan), (nan, 1.0)])
    assert [s.segment for s in store.info("sc/nan").segments] == [0]
