"""The analytics views over a real export (the Spark export job, several batches): the export
records where it wrote, `slice_rows` is exactly a bounded read of each slice, and the rates
are continuous across events and batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import cli
from pipeline.analytics.sandbox import query
from pipeline.analytics.sources import AnalyticsPaths
from pipeline.jobs.export import registered_exports
from pipeline.jobs.slices import record_slices, time_window_slice
from pipeline.settings import load_settings
from tests.jobs.test_replay_support import MS, STREAM, T0, nic_stream

pytestmark = pytest.mark.spark
SECOND = 1_000_000_000
PLAN = {
    "edge1": [[1000 * (k + 1)] * 10 for k in range(6)],
    "edge2": [[500] * 10, [70_000] * 10, [500] * 10, [9] * 10, [500] * 10, [500] * 10],
}


@pytest.fixture
def exported(spark, store, store_dir, tmp_path, capsys):
    """NIC events of two hosts over six seconds, exported in batches of three events to a
    directory nothing else names, and two slices of them; then `sluice analytics refresh`."""
    nic_stream(store, PLAN)
    middle = time_window_slice(store, STREAM, T0 + SECOND, T0 + 3 * SECOND)
    one = time_window_slice(store, STREAM, T0 + 2 * SECOND, T0 + 5 * SECOND, sensor="edge2")
    record_slices(store, [middle, one])
    output = tmp_path / "somewhere" / "network-export"
    argv = ["--store", f"embedded:{store_dir}", "run", "export", "--stream", STREAM]
    argv += ["--schema", "NetworkSamples", "--output", str(output), "--max-events", "3"]
    assert cli.main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["batches"] >= 3
    assert cli.main(["--store", f"embedded:{store_dir}", "analytics", "refresh"]) == 0
    capsys.readouterr()
    return [middle, one], output


def bounded_read(store, record) -> list[tuple[int, int, int]]:
    """(segment, offset, sample) of every row of the events between the slice's cuts."""
    rows = []
    for event in store.read(record.stream, *record.cuts):
        samples = len(json.loads(event.payload)["TimestampNanos"])
        rows += [(event.segment, event.offset, k) for k in range(samples)]
    return sorted(rows)


def test_the_export_records_where_it_wrote(exported):
    _, output = exported
    [record] = registered_exports()
    assert (record.stream, record.schema, record.output) == (
        STREAM,
        "NetworkSamples",
        str(output),
    )
    paths = AnalyticsPaths.from_settings(load_settings())
    assert query(paths, "SELECT count(*) FROM samples")[1] == [(120,)]


def test_slice_rows_are_exactly_a_bounded_read_of_the_slice(exported, store):
    slices, _ = exported
    paths = AnalyticsPaths.from_settings(load_settings())
    for record in slices:
        sql = "SELECT _segment, _offset, _sample FROM slice_rows WHERE slice_id = '{}' ORDER BY ALL"
        got = query(paths, sql.format(record.slice_id))[1]
        expected = bounded_read(store, record)
        assert got == expected and expected
    # the rows inside the slice's times are flagged
    middle = slices[0]
    window = query(
        paths,
        f"SELECT count(*) FILTER (in_window), count(*) FROM slice_rows "
        f"WHERE slice_id = '{middle.slice_id}'",
    )[1]
    assert window == [(40, 40)]  # seconds 1 and 2 of both hosts


def test_rates_are_continuous_across_events_and_batches(exported):
    paths = AnalyticsPaths.from_settings(load_settings())
    _, rows = query(
        paths,
        "SELECT RemoteAddr, TimestampNanos, RxBytes, rx_mbps FROM rates "
        "ORDER BY RemoteAddr, TimestampNanos",
    )
    for host in PLAN:
        mine = [r for r in rows if r[0] == host]
        assert len(mine) == 60
        assert [r[3] is None for r in mine].count(True) == 1  # only the first sample
        assert mine[0][3] is None
        t = np.array([r[1] for r in mine], dtype=np.int64)
        rx = np.array([r[2] for r in mine], dtype=np.int64)
        expected = np.diff(rx) * 8 / 1e6 / (np.diff(t) / 1e9)
        np.testing.assert_allclose([r[3] for r in mine[1:]], expected)
    # across an event boundary: edge2's first sample of second 1 follows its last of second 0
    first_of_second_1 = next(r for r in rows if r[0] == "edge2" and r[1] == T0 + SECOND)
    assert first_of_second_1[3] == pytest.approx(70_000 * 8 / 1e6 / ((SECOND - 9 * MS) / 1e9))
