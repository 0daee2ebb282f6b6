"""`min_samples`: a run becomes a slice only when enough of its samples meet the condition,
so a lone spike is not called a burst (the demo's bookmark condition)."""

from __future__ import annotations

import re

import pytest

from pipeline.jobs.bookmark import (
    BookmarkError,
    BookmarkSpec,
    BookmarkState,
    Condition,
    check_conditions,
)
from pipeline.jobs.runner import SERVICE
from pipeline.settings import load_settings
from tests.jobs.test_bookmark import PLAN, events_table, run_batches
from tests.jobs.test_command_line import parse
from tests.jobs.test_replay_support import STREAM, nic_stream

BURST = Condition("burst", value=100.0)


def spec(store_dir, min_samples: int) -> BookmarkSpec:
    return BookmarkSpec(
        STREAM, "NetworkSamples", f"embedded:{store_dir}", (BURST,), min_samples=min_samples
    )


def test_runs_with_fewer_samples_than_the_minimum_are_not_slices(store, store_dir, tmp_path):
    nic_stream(store, PLAN)
    # edge1 bursts in events 1-2 (18 samples over 100 Mbit/s: each event's first sample
    # follows a one-second pause) and in event 4 (9 samples); edge2 in event 3 (9 samples)
    everything = run_batches(store, spec(store_dir, 1), tmp_path / "a", [events_table(store)])
    assert len(everything) == 3
    bursts = run_batches(store, spec(store_dir, 10), tmp_path / "b", [events_table(store)])
    assert [(s.sensor, s.reason) for s in bursts] == [
        ("edge1", "NIC rate above 100 Mbit/s, at least 10 samples")
    ]
    assert run_batches(store, spec(store_dir, 19), tmp_path / "c", [events_table(store)]) == []


def test_the_minimum_is_on_the_command_line_and_in_sluice_toml(tmp_path):
    bspec = BookmarkSpec(STREAM, "NetworkSamples", "embedded:/x", (BURST,), min_samples=20)
    assert "--min-samples" in bspec.command_line()
    assert parse(bspec.command_line()) == (bspec, SERVICE)
    config = tmp_path / "sluice.toml"
    config.write_text(
        '[streams.n]\nstream = "a/b"\nschema = "NetworkSamples"\n'
        '[streams.n.mirror]\nstream = "c/d"\nstore = "edge"\n'
        "[streams.n.bookmark]\nburst_mbps = 5.0\nmin_samples = 20\n"
    )
    family = load_settings(config, environ={}).family("n")
    assert family.bookmark is not None and family.bookmark.min_samples == 20
    with pytest.raises(BookmarkError, match=re.escape("--min-samples: 0 is not a number")):
        check_conditions(
            BookmarkSpec(STREAM, "NetworkSamples", "embedded:/x", (BURST,), "k", min_samples=0)
        )


def test_a_state_saved_before_samples_were_counted_still_loads():
    run = '{"ranges": {"0": [0, 10]}, "t_min": 1, "t_max": 2}'
    old = f'{{"last": {{}}, "runs": {{"edge1": {run}}}, "version": 1}}'
    state = BookmarkState.from_json(old)
    assert state.runs["edge1"].samples is None  # passes any minimum when it closes
