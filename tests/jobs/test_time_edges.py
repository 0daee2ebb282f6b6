"""Event times as sensors really send them, past the flatten: the export's hour partitions
and its files, slice windows (`sluice slices create --from/--to`, `time_window_slice`, the
store's `time_cuts`) and the analytics rates."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.analytics.rates import rates_sql
from pipeline.jobs.slices import (
    InvalidTimeWindow,
    list_slices,
    parse_time_ns,
    time_window_slice,
)
from pipeline.schemas import flatten_plan
from pipeline.spark.options import ExportOptions
from tests.jobs.test_replay_support import STREAM, T0, nic_payload, write_event

HOUR_NS = 3600 * 10**9
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def nic(times: list[int], key: str = "eth0") -> bytes:
    n = len(times)
    return json.dumps(
        {"RemoteAddr": "h", "Interface": key, "TimestampNanos": times}
        | {"RxBytes": list(range(n)), "TxBytes": list(range(n)), "LastTimestampFormatted": "x"}
    ).encode()


def source_batch(payloads: list[bytes], first_offset: int = 0) -> pa.RecordBatch:
    """Event rows as the `sluice` source gives them."""
    offsets = list(range(first_offset, first_offset + len(payloads)))
    return pa.RecordBatch.from_pydict(
        {"payload": payloads, "segment": [0] * len(payloads), "offset": offsets}
    )


# --- the export's tasks ----------------------------------------------------------------------


def test_a_task_keeps_few_files_open_however_many_hours_its_events_span(tmp_path):
    """A backfill of 300 hours: each hour's rows still land in that hour, but a task held one
    open file per hour and format to its end (here 600; thousands ran the process out of file
    descriptors, `Too many open files`, at every run of the batch again)."""
    from pipeline.schemas import Events, flatten
    from pipeline.spark.export_writer import MAX_OPEN_FILES, _TaskFiles, bucket_of

    hours = 300
    payloads = [nic([T0 + h * HOUR_NS, T0 + h * HOUR_NS + 1]) for h in range(hours)]
    payloads.append(nic([T0 + 5 * HOUR_NS + 2]))  # an hour whose file was closed already
    plan = flatten_plan("NetworkSamples")
    formats = ("parquet", "csv")
    opts = ExportOptions("NetworkSamples", str(tmp_path), formats, 10**6, None, None, None)
    files = _TaskFiles(opts, plan, tmp_path)
    for first in range(0, len(payloads), 100):  # chunks, as the task's writer thread gets them
        events = Events.from_arrow(source_batch(payloads[first : first + 100], first))
        result = flatten(plan, events, dictionary=True)
        files.write_rows(result.rows, result.time_ns)
        assert len(files.open) <= MAX_OPEN_FILES
    rows: dict[tuple[str, str], int] = {}
    for file in files.close():
        held = pq.read_metadata(file.staged).num_rows if file.kind == "parquet" else file.rows
        rows[(file.kind, file.bucket)] = rows.get((file.kind, file.bucket), 0) + held
    expected = {bucket_of(T0 // HOUR_NS + h): 2 for h in range(hours)}
    expected[bucket_of(T0 // HOUR_NS + 5)] = 3
    for kind in formats:
        assert {b: n for (k, b), n in rows.items() if k == kind} == expected


def test_an_event_time_of_zero_counts_in_a_tasks_time_range(tmp_path):
    """1970-01-01T00:00:00 is a time: a task's range ignored it (`low or 2**63`) and reported
    the next chunk's, and Dagster's checks start their window there."""
    from pipeline.spark.export_writer import _stage

    opts = ExportOptions("NetworkSamples", str(tmp_path), ("parquet",), 10**6, None, None, None)
    first = _stage(opts, 0, iter([source_batch([nic([0])]), source_batch([nic([5])], 1)]))
    assert (first.min_time_ns, first.max_time_ns) == (0, 5)
    last = _stage(opts, 1, iter([source_batch([nic([0])]), source_batch([nic([-5])], 1)]))
    assert (last.min_time_ns, last.max_time_ns) == (-5, 0)


def test_rows_split_by_hour_across_the_whole_range_of_nanoseconds():
    from pipeline.spark.export_writer import bucket_of, by_hour

    times = [I64_MIN, -1, 0, 1, HOUR_NS, I64_MAX]
    rows = pa.table({"i": list(range(len(times)))})
    parts = [(bucket_of(h), t.column("i").to_pylist()) for h, t in by_hour(rows, np.array(times))]
    assert parts == [
        ("date=1677-09-21/hour=00", [0]),
        ("date=1969-12-31/hour=23", [1]),
        ("date=1970-01-01/hour=00", [2, 3]),
        ("date=1970-01-01/hour=01", [4]),
        ("date=2262-04-11/hour=23", [5]),
    ]


@pytest.mark.spark
def test_export_places_times_from_1677_to_2262_and_quarantines_what_has_no_hour(
    spark, store, store_dir, tmp_path, capsys
):
    """Through Spark: NIC events at the epoch, before 1970 and at both ends of 64-bit
    nanoseconds land in their own hours; a `timestamp-millis` export's event of year 300,000
    is quarantined with the reason (it landed in 1969 or 1677 before, by wrap-around)."""
    schema = tmp_path / "Millis.avsc"
    millis = {"type": "long", "logicalType": "timestamp-millis"}
    fields = [{"name": "Sensor", "type": "string"}, {"name": "Stamp", "type": millis}]
    schema.write_text(json.dumps({"type": "record", "name": "Millis", "fields": fields}))
    store.create_stream("edge/nic")
    store.create_stream("edge/millis")
    with store.writer("edge/nic") as writer:
        for times in ([0, 1], [-1], [I64_MIN], [I64_MAX], [T0 + 2, T0 + 1]):
            writer.write(nic(times), routing_key="eth0")
    with store.writer("edge/millis") as writer:
        for at in (0, -1, I64_MAX // 10**6, 10**16, -(10**16)):
            writer.write(json.dumps({"Sensor": "s", "Stamp": at}).encode(), routing_key="s")
    store.close()
    base = ["--store", f"embedded:{store_dir}", "run", "export", "--available-now"]
    nic_out, millis_out = tmp_path / "nic", tmp_path / "millis"
    for stream, name, out in (("edge/nic", "NetworkSamples", nic_out),
                              ("edge/millis", str(schema), millis_out)):  # fmt: skip
        argv = [*base, "--stream", stream, "--schema", name, "--output", str(out)]
        assert cli.main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()

    def placed(out: Path, column: str) -> list[tuple]:
        glob = f"{out}/parquet/date=*/hour=*/*.parquet"
        return (
            duckdb.connect()
            .execute(
                f"SELECT date::VARCHAR, hour::INT, {column} FROM read_parquet('{glob}', "
                f"hive_partitioning = true) ORDER BY {column}"
            )
            .fetchall()
        )

    t0 = parse_time_ns("2026-11-01T10:00Z")
    assert placed(nic_out, "TimestampNanos") == [
        ("1677-09-21", 0, I64_MIN),
        ("1969-12-31", 23, -1),
        ("1970-01-01", 0, 0),
        ("1970-01-01", 0, 1),
        ("2026-11-01", 10, t0 + 1),
        ("2026-11-01", 10, t0 + 2),
        ("2262-04-11", 23, I64_MAX),
    ]
    assert placed(millis_out, "Stamp") == [
        ("1969-12-31", 23, -1),
        ("1970-01-01", 0, 0),
        ("2262-04-11", 23, I64_MAX // 10**6),
    ]
    quarantine = (
        duckdb.connect()
        .execute(
            f"SELECT reason FROM read_parquet('{millis_out}/_quarantine/*.parquet') ORDER BY reason"
        )
        .fetchall()
    )
    assert [r for (r,) in quarantine] == [
        f"event time out of range: Stamp = {t} milliseconds since 1970 is {edge}, beyond 64-bit "
        "nanoseconds: no hour to put it in (schema Millis)"
        for t, edge in ((-(10**16), "before 1677-09-21"), (10**16, "after 2262-04-11"))
    ]


# --- slice windows ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2026-11-01T10:00Z", T0),
        ("2026-11-01T10:00", T0),  # no zone: UTC, never a local time (no DST to be ambiguous)
        ("2026-11-01T15:30+05:30", T0),
        ("2026-11-01T10:00:00.000000001Z", T0 + 1),
        ("2026-11-01T10:00:00,123456789+00:00", T0 + 123_456_789),
        ("20261101T100000.5Z", T0 + 500_000_000),
        ("1969-12-31T23:59:59.999999999Z", -1),
        ("1677-09-21T00:12:43.145224192Z", I64_MIN),
        ("2262-04-11T23:47:16.854775807Z", I64_MAX),
    ],
)
def test_window_times_parse_to_the_nanosecond(text, ns):
    assert parse_time_ns(text) == ns


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("2300-01-01", "event times are 64-bit nanoseconds since 1970, from "
                       "1677-09-21T00:12:43.145224192Z to 2262-04-11T23:47:16.854775807Z"),
        ("1677-09-21T00:12:43.145224191Z", "event times are 64-bit nanoseconds"),
        ("0001-01-01", "event times are 64-bit nanoseconds"),
        ("2026-11-01T10.5", "a fraction of an hour or minute: give the seconds"),
        ("2026-11-01T10:30.5Z", "a fraction of an hour or minute: give the seconds"),
        ("2026-11-01T10:00:00.0000000001Z", "more than 9 digits after the seconds"),
    ],
)  # fmt: skip
def test_window_times_no_event_can_have_are_refused(text, reason):
    """Python read `T10.5` as 10:00:00.5 and dropped digits past the microsecond; a time
    past 2262 made a slice whose bounds no int64 column holds (the analytics refresh)."""
    with pytest.raises(InvalidTimeWindow, match=re.escape(f"invalid time {text!r}: {reason}")):
        parse_time_ns(text)


def test_a_window_in_nanoseconds_holds_the_event_at_its_nanosecond(store, store_dir, capsys):
    store.create_stream(STREAM, segments=1)
    write_event(store, "edge1", nic_payload("edge1", T0 + 500, 0, [1]), (T0 + 500, T0 + 500))
    store.close()
    base = ["--store", f"embedded:{store_dir}", "slices", "create", STREAM]
    window = ["--from", "2026-11-01T10:00:00.0000005Z", "--to", "2026-11-01T10:00:00.000000501Z"]
    assert cli.main([*base, *window]) == 0, capsys.readouterr().err
    created = json.loads(capsys.readouterr().out)
    assert (created["events"], created["start_time_ns"], created["end_time_ns"]) == (
        1,
        T0 + 500,
        T0 + 500,
    )
    # --to equal to --from: refused, nothing recorded
    same = ["--from", "2026-11-01T10:00:00.0000005Z", "--to", "2026-11-01T10:00:00.000000500Z"]
    assert cli.main([*base, *same]) == 1
    assert capsys.readouterr().err.startswith(
        "sluice: error: --to 2026-11-01T10:00:00.000000500Z must be after --from "
        "2026-11-01T10:00:00.0000005Z (it is the same time as --from"
    )
    far = ["--from", "1900-01-01", "--to", "2300-01-01"]
    assert cli.main([*base, *far]) == 1
    assert capsys.readouterr().err.startswith("sluice: error: invalid time '2300-01-01': ")
    from pipeline.streams import open_store

    with open_store(f"embedded:{store_dir}") as reopened:
        assert len(list_slices(reopened, STREAM)) == 1


def test_a_window_of_ints_beyond_nanoseconds_is_refused(store):
    store.create_stream(STREAM)
    message = f"invalid time '{I64_MAX + 2}': --to is {I64_MAX + 2} ns since 1970, beyond"
    with pytest.raises(InvalidTimeWindow, match=re.escape(message)):
        time_window_slice(store, STREAM, 0, I64_MAX + 2)
    with pytest.raises(InvalidTimeWindow, match=re.escape(f"--from is {I64_MIN - 1} ns")):
        time_window_slice(store, STREAM, I64_MIN - 1, 0)
    record = time_window_slice(store, STREAM, I64_MIN, I64_MAX + 1)  # every time there is
    assert (record.start_time_ns, record.end_time_ns) == (I64_MIN, I64_MAX)


def test_time_cuts_find_an_event_whose_bounds_were_given_max_first(store, store_dir):
    """The embedded store kept a commit's bounds as given (it now refuses max-first ones:
    `check_time_bounds`): (T0 + 10, T0) were read as no time at all, so a window inside them
    cut the event out of its slice. A store written before keeps such bounds."""
    store.create_stream(STREAM, segments=1)
    write_event(store, "edge1", nic_payload("edge1", T0, 0, [1]), (T0, T0 + 10))
    write_event(store, "edge1", nic_payload("edge1", T0 + 20, 0, [1]), (T0 + 20, T0 + 20))
    with sqlite3.connect(store_dir / "catalog.db") as db:  # as an older store wrote them
        db.execute("UPDATE blocks SET t_min = t_max, t_max = t_min WHERE t_min = ?", (T0,))
    for start, end, events in ((T0 + 3, T0 + 4, 1), (T0, T0 + 1, 1), (T0 + 10, T0 + 21, 2)):
        record = time_window_slice(store, STREAM, start, end)
        assert len(list(store.read(STREAM, *record.cuts))) == events


# --- analytics rates -------------------------------------------------------------------------


def test_rates_of_samples_centuries_apart_are_computed_not_an_overflow():
    """Two BIGINT times (or counters) further apart than a BIGINT holds stopped the whole
    rates query (DuckDB: `Overflow in subtraction of INT64`), so the refresh of every export."""
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE nic AS SELECT * FROM (VALUES "
        "(-9000000000000000000, 9000000000000000000, 0, 0), "
        "(9000000000000000000, -9000000000000000000, 0, 1)) "
        "v(TimestampNanos, RxBytes, TxBytes, _offset)"
    )
    relation = (
        "(SELECT 'e' AS export, 's' AS stream, NULL AS time, 'h' AS RemoteAddr, "
        "'eth0' AS Interface, TimestampNanos, RxBytes, TxBytes, 0 AS _segment, _offset, "
        "0 AS _sample FROM nic)"
    )
    rows = con.execute(f"SELECT interval_s, rx_mbps, counter_reset FROM ({rates_sql(relation)})")
    assert rows.fetchall() == [(None, None, False), (18e9, None, True)]
