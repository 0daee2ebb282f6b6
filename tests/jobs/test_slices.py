"""Time-window slices: cuts from writers' time bounds, stable ids, listing."""

from __future__ import annotations

import json
import re

import pytest

from pipeline import cli
from pipeline.jobs.slices import (
    BadSliceRecord,
    InvalidTimeWindow,
    SliceNotFound,
    SliceRecord,
    WindowOutOfOrder,
    find_slice,
    format_ns,
    list_slices,
    parse_time_ns,
    record_slices,
    recorded_as,
    time_window_slice,
)
from pipeline.streams import open_store
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_payload, nic_stream, write_event

SECOND = 1_000_000_000


def test_time_window_slice_holds_exactly_the_events_of_the_window(store):
    written = nic_stream(store, {"edge1": [[100] * 10] * 5, "edge2": [[50] * 10] * 5})
    record = time_window_slice(store, STREAM, T0 + 1 * SECOND, T0 + 3 * SECOND)
    start, end = record.cuts
    got = [(e.routing_key, e.offset) for e in store.read(STREAM, start, end)]
    expected = [
        (w.key, w.offset) for w in written if w.t_max >= T0 + SECOND and w.t_min < T0 + 3 * SECOND
    ]
    assert sorted(got) == sorted(expected) and len(got) == 4
    assert (record.start_time_ns, record.end_time_ns) == (T0 + SECOND, T0 + 3 * SECOND - 1)


def test_slice_ids_are_stable_and_recording_twice_adds_nothing(store):
    nic_stream(store, {"edge1": [[1] * 3] * 3})
    a = time_window_slice(store, STREAM, T0, T0 + 2 * SECOND, sensor="edge1")
    b = time_window_slice(store, STREAM, T0, T0 + 2 * SECOND, sensor="edge1")
    other = time_window_slice(store, STREAM, T0, T0 + 2 * SECOND, sensor="edge2")
    assert a == b and a.slice_id != other.slice_id
    assert record_slices(store, [a, other]) == [a, other]
    assert record_slices(store, [b]) == []
    assert list_slices(store, STREAM) == [a, other]
    assert find_slice(store, a.slice_id) == a
    with pytest.raises(SliceNotFound, match=re.escape("no slice 'sl-nope' in sluice/slices")):
        find_slice(store, "sl-nope")


def test_the_same_slice_with_its_idle_segments_elsewhere_is_recorded_once(store):
    """A bookmark checkpoint made again after a truncation finds each slice again with the
    segments it reads nothing of at the stream's new head: other cut texts, another id, the
    same events. It is known by what it reads, and not recorded twice."""
    nic_stream(store, {"edge1": [[1] * 3] * 3}, segments=2)
    tail = store.tail(STREAM)
    [(busy, end)] = [(s, o) for s, o in tail.positions if o > 0]
    [idle] = [s for s, _ in tail.positions if s != busy]

    def found(idle_at: int, reason: str = "burst") -> SliceRecord:
        return SliceRecord.create(
            stream=STREAM,
            sensor="edge1",
            start_cut=tail.moved_to({busy: 0, idle: idle_at}),
            end_cut=tail.moved_to({busy: end, idle: idle_at}),
            start_time_ns=T0,
            end_time_ns=T0 + 2 * SECOND,
            reason=reason,
            created_by="sluice run bookmark (bookmark)",
        )

    first, again = found(0), found(7)
    assert first.slice_id != again.slice_id
    assert record_slices(store, [first]) == [first]
    assert record_slices(store, [again]) == []
    assert list_slices(store, STREAM) == [first]
    assert recorded_as(store, again) == first  # what `slices create` prints: the one replayed
    other = found(7, reason="another condition")  # what it reads is the same, its reason not
    assert record_slices(store, [other]) == [other]


def test_slices_create_of_one_window_spelled_otherwise_or_later_records_it_once(
    store, store_dir, capsys
):
    """`sluice slices create` run again: the same window in other words, or after events
    came in past it, is the same slice (its id), so nothing is recorded twice."""
    nic_stream(store, {"edge1": [[1] * 3] * 3, "edge2": [[1] * 3] * 3})
    store.close()
    create = ["--store", f"embedded:{store_dir}", "slices", "create", STREAM, "--sensor", "edge1"]
    window = ["--from", "2026-11-01T10:00:01Z", "--to", "2026-11-01T10:00:02Z"]
    in_other_words = ["--from", "2026-11-01T11:00:01+01:00", "--to", "2026-11-01T10:00:02.0"]
    assert cli.main([*create, *window]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["status"] == "created"
    assert cli.main([*create, *in_other_words]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "exists"
    with open_store(f"embedded:{store_dir}") as later:  # edge1 at 10:00:05, past the window
        t0 = T0 + 5 * SECOND
        write_event(later, "edge1", nic_payload("edge1", t0, 10**6, [1] * 3), (t0, t0 + 2 * MS))
    assert cli.main([*create, *window]) == 0
    again = json.loads(capsys.readouterr().out)
    assert (again["status"], again["slice_id"]) == ("exists", created["slice_id"])
    with open_store(f"embedded:{store_dir}") as reopened:
        assert len(list(reopened.read("sluice/slices"))) == 1


def test_a_foreign_event_in_the_slices_stream_is_reported(store):
    store.create_stream("sluice/slices")
    with store.writer("sluice/slices") as w:
        w.write(b'{"version": 99}', routing_key="x")
    with pytest.raises(BadSliceRecord, match=re.escape("version 99, this Sluice reads version 1")):
        list_slices(store)


def test_times_parse_as_utc_and_bad_windows_are_refused(store):
    assert parse_time_ns("2026-11-01T10:00Z") == T0 == parse_time_ns("2026-11-01T10:00")
    assert parse_time_ns("2026-11-01T11:00+01:00") == T0
    assert format_ns(T0 + 5) == "2026-11-01T10:00:00.000000005Z"
    with pytest.raises(InvalidTimeWindow, match="use ISO 8601"):
        parse_time_ns("yesterday")
    nic_stream(store, {"edge1": [[1]]})
    same = f"--to {format_ns(T0)} must be after --from {format_ns(T0)} (it is the same time"
    with pytest.raises(WindowOutOfOrder, match=re.escape(same)):
        time_window_slice(store, STREAM, T0, T0)


@pytest.mark.parametrize(
    "window",
    [
        ("2026-11-01T11:00Z", "2026-11-01T10:00Z", "before"),
        ("2026-11-01T10:00Z", "2026-11-01T10:00Z", "the same time as"),
        ("2026-11-01T10:00Z", "2026-11-01T11:00+01:00", "the same time as"),
    ],
)
def test_a_window_not_ending_after_its_start_is_one_line_with_the_times_as_given(
    store, store_dir, capsys, window
):
    """The times are valid: no "invalid time", no ISO 8601 advice, no reformatted times."""
    start, end, when = window
    nic_stream(store, {"edge1": [[1]]})
    argv = ["--store", f"embedded:{store_dir}", "slices", "create", STREAM]
    assert cli.main([*argv, "--from", start, "--to", end]) == 1
    assert capsys.readouterr().err == (
        f"sluice: error: --to {end} must be after --from {start} (it is {when} --from, so the "
        "window [--from, --to) holds nothing): give a later --to or an earlier --from\n"
    )
    assert list_slices(store, STREAM) == []


def test_record_round_trips_through_json():
    record = SliceRecord(
        slice_id="sl-1",
        stream=STREAM,
        sensor="edge1",
        start_cut="v1~examples~network~0-0",
        end_cut="v1~examples~network~0-10",
        start_time_ns=1,
        end_time_ns=2,
        reason="r",
        created_by="me",
        sensor_by="routing_key",
    )
    assert json.loads(record.to_json())["version"] == 1


def test_sluice_slices_create_and_list(store, store_dir, monkeypatch, capsys):
    nic_stream(store, {"edge1": [[1] * 3] * 3, "edge2": [[1] * 3] * 3})
    store.close()
    base = ["--store", f"embedded:{store_dir}", "slices"]
    window = ["--from", "2026-11-01T10:00:01Z", "--to", "2026-11-01T10:00:02Z"]
    assert cli.main([*base, "create", STREAM, *window, "--sensor", "edge2"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["status"] == "created" and created["sensor"] == "edge2"
    assert created["start_time"] == "2026-11-01T10:00:01.000000000Z"
    assert (created["events"], created["span"]) == (1, "1.000 s")  # edge2's event of 10:00:01
    assert cli.main([*base, "create", STREAM, *window, "--sensor", "edge2"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "exists"
    assert cli.main([*base, "list", STREAM]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["slice_id", "sensor", "events", "start_time", "span"]
    assert table[2].split()[:3] == [created["slice_id"], "edge2", "1"]
    assert table[-1] == "(1 row)"
    assert cli.main([*base, "list", STREAM, "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["slice_id"], r["events"]) for r in listed] == [(created["slice_id"], 1)]
    assert cli.main([*base, "create", "examples/nothing", *window]) == 1
    assert "stream examples/nothing does not exist" in capsys.readouterr().err


def test_an_empty_window_is_refused_unless_allowed(store, store_dir, capsys):
    nic_stream(store, {"edge1": [[1] * 3] * 3})
    store.close()
    base = ["--store", f"embedded:{store_dir}", "slices"]
    window = ["--from", "2026-11-01T11:00Z", "--to", "2026-11-01T12:00Z"]
    assert cli.main([*base, "create", STREAM, *window]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        "sluice: error: no events of examples/network between 2026-11-01T11:00:00.000000000Z"
    )
    assert "pass --allow-empty to record it anyway" in err and len(err.splitlines()) == 1
    assert cli.main([*base, "list", STREAM, "--json"]) == 0
    assert capsys.readouterr().out == ""  # nothing was recorded
    # a sensor with no event in a window that has events of others is empty too
    inside = ["--from", "2026-11-01T10:00Z", "--to", "2026-11-01T10:00:02Z"]
    assert cli.main([*base, "create", STREAM, *inside, "--sensor", "edge9"]) == 1
    assert "no events of examples/network of sensor edge9" in capsys.readouterr().err
    assert cli.main([*base, "create", STREAM, *window, "--allow-empty"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert (created["status"], created["events"], created["bytes"]) == ("created", 0, 0)
    assert created["span"] == "3600.000 s"


def test_slices_list_of_a_stream_that_does_not_exist_is_refused(store, store_dir, capsys):
    nic_stream(store, {"edge1": [[1] * 3] * 3})
    before = (store.list_streams(), store.info(STREAM))
    store.close()
    base = ["--store", f"embedded:{store_dir}", "slices", "list", "examples/netwrok"]
    for extra in ([], ["--json"]):
        assert cli.main([*base, *extra]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (
            "sluice: error: stream examples/netwrok does not exist: create it with"
            " `sluice store create examples/netwrok` or check `sluice store list`\n"
        )
    with open_store(f"embedded:{store_dir}") as reopened:
        assert (reopened.list_streams(), reopened.info(STREAM)) == before


@pytest.mark.parametrize(
    ("sensor", "said"),
    [("edge\udcff1", "is a lone surrogate"), ("k" * 1025, "it is 1025 bytes in UTF-8")],
)
def test_a_sensor_no_event_can_carry_as_its_key_is_refused(store, sensor, said):
    """`slices create --sensor` with a key no event can have ended as `EmptySlice` ("no
    events"), as if the window were wrong; the key itself is refused now."""
    from pipeline.streams import InvalidRoutingKey

    nic_stream(store, {"edge1": [[100] * 10] * 2})
    with pytest.raises(InvalidRoutingKey, match=re.escape(said)):
        time_window_slice(store, STREAM, T0, T0 + 3 * SECOND, sensor=sensor)
    by_columns = time_window_slice(  # a name made of columns is not a routing key
        store, STREAM, T0, T0 + 3 * SECOND, sensor="k" * 1025, sensor_by="RemoteAddr"
    )
    assert by_columns.sensor == "k" * 1025
