"""Routing keys and sensor names through the jobs: the mirror, the bookmark, slices and
replays keep every sensor apart, exactly as written; what a job cannot carry is refused with
a reason before Spark starts."""

from __future__ import annotations

import dataclasses
import logging
import re

import pytest

from pipeline import cli
from pipeline.config import sluice_home
from pipeline.jobs.bookmark import BookmarkError, BookmarkSpec, Condition, check_spec
from pipeline.jobs.mirror import MirrorSpec
from pipeline.jobs.replay import load_model, replay
from pipeline.jobs.slices import list_slices
from pipeline.jobs.stream_join import SeriesSource, StreamJoinSpec
from pipeline.schemas import flatten_plan
from pipeline.streams import open_store
from tests.jobs.test_bookmark import BURST, CALM, events_table, run_batches
from tests.jobs.test_command_line import EDGE, OUT, parse
from tests.jobs.test_replay_support import STREAM, T0, nic_payload, nic_stream, write_event

PLAN = flatten_plan("NetworkSamples")
#: Sensors a job must keep apart (a burst each in their second event).
KEYS = ["", "a#b", "a/b", "\u00e9", "e\u0301", "K", "k", "a\nb", "a\x00b", "😀", ' q"=, ']


def burst_spec(store_dir, sensor_by="routing_key") -> BookmarkSpec:
    burst = (Condition("burst", value=100.0),)
    return BookmarkSpec(STREAM, "NetworkSamples", f"embedded:{store_dir}", burst, sensor_by)


def test_sensors_named_by_columns_holding_a_slash_are_two_sensors(store, store_dir, tmp_path):
    # RemoteAddr "a/b" on eth0, and RemoteAddr "a" on "b/eth0": once both named "a/b/eth0"
    store.create_stream(STREAM, segments=2)
    for k, rates in enumerate([CALM, BURST, CALM]):
        t0 = T0 + k * 1000 * 1_000_000
        for addr, nic in (("a/b", "eth0"), ("a", "b/eth0")):
            payload = nic_payload(addr, t0, k * 1000, rates).replace(b'"eth0"', f'"{nic}"'.encode())
            write_event(store, addr, payload, (t0, t0 + 9_000_000))
    bspec = burst_spec(store_dir, "RemoteAddr,Interface")
    slices = run_batches(store, bspec, tmp_path / "state", [events_table(store)])
    assert sorted(s.sensor for s in slices) == ["a/b\\/eth0", "a\\/b/eth0"]


@pytest.mark.parametrize("columns", ["_routing_key", "RemoteAddr,_time_ns", "RemoteAddr,,x"])
def test_sensor_columns_the_rows_lack_are_refused_before_spark_starts(store_dir, columns):
    with pytest.raises(BookmarkError, match=re.escape("--sensor-by: no column '")):
        check_spec(burst_spec(store_dir, columns), PLAN)


def test_a_slices_stream_that_is_the_bookmarked_stream_is_refused(store_dir):
    spec = dataclasses.replace(burst_spec(store_dir), slices_stream=STREAM)
    with pytest.raises(BookmarkError, match=re.escape(f"{STREAM} is the stream it bookmarks")):
        check_spec(spec, PLAN)


def test_events_without_a_key_are_said_to_belong_to_no_sensor(store, store_dir, tmp_path, caplog):
    nic_stream(store, {"edge1": [CALM, BURST, CALM]})
    payload = nic_payload("edge2", T0, 0, BURST)
    txn = store.begin_transaction(STREAM)
    txn.write(payload)  # no routing key
    txn.commit()
    with caplog.at_level(logging.WARNING, logger="pipeline.jobs.bookmark"):
        slices = run_batches(store, burst_spec(store_dir), tmp_path / "s", [events_table(store)])
    assert [s.sensor for s in slices] == ["edge1"]
    said = f"bookmark {STREAM}: 10 samples of 1 events have no routing key: they belong to no"
    assert said in caplog.text
    assert "name sensors by columns (--sensor-by) to bookmark them" in caplog.text


@pytest.mark.parametrize(
    "spec",
    [
        MirrorSpec("edge/network", "site/network", EDGE, EDGE, "-site1"),
        MirrorSpec("edge/network", "site/network", EDGE, EDGE, "a#b=c"),
        StreamJoinSpec(SeriesSource("s/x", ""), SeriesSource("s/x", "-k#1"), "NetworkSamples",
                       EDGE, OUT),
    ],
    ids=["mirror key like an option", "mirror key with # and =", "join: empty key, -k#1"],
)  # fmt: skip
def test_a_spec_with_an_unusual_key_survives_its_command_line(spec):
    assert parse(spec.command_line())[0] == spec


@pytest.mark.spark
@pytest.mark.slow
def test_mirror_bookmark_and_replay_keep_every_key_apart(spark, store, store_dir, capsys):
    nic_stream(store, {key: [CALM, BURST, CALM] for key in KEYS})
    uri = f"embedded:{store_dir}"
    run = ["--store", uri, "run"]
    fixed_keys = {"m/fixed": "s😀\x00 1", "m/spaced": " site-1\n", "m/empty": ""}
    for target in ("m/own", *fixed_keys):
        fixed = [f"--fixed-routing-key={fixed_keys[target]}"] if target in fixed_keys else []
        argv = [*run, "mirror", "--stream", STREAM, "--to", target, *fixed, "--available-now"]
        assert cli.main(argv) == 0
    bookmark = ["bookmark", "--stream", STREAM, "--schema", "NetworkSamples"]
    assert cli.main([*run, *bookmark, "--burst-mbps", "100", "--available-now"]) == 0
    capsys.readouterr()
    with open_store(uri) as fresh:
        source = sorted((e.routing_key, e.payload) for e in fresh.read(STREAM))
        assert sorted((e.routing_key, e.payload) for e in fresh.read("m/own")) == source
        for target, key in fixed_keys.items():  # as given: white space, the empty key
            assert {e.routing_key for e in fresh.read(target)} == {key}
        slices = {s.sensor: s for s in list_slices(fresh, STREAM)}
        assert sorted(slices) == sorted(KEYS)
        model = load_model("pipeline.models.nic:throughput", {})
        for key in ("", "\u00e9", "e\u0301", "k", "a#b"):
            result = replay(
                spark, fresh, slices[key].slice_id, model, plan=PLAN, home=sluice_home()
            )
            # the burst event of this key alone: 9 of its 10 samples are inside the slice's
            # times (the first one's rate is measured from the calm event before it)
            assert (result.metrics["input_events"], result.metrics["input_rows"]) == (1, 9), key
