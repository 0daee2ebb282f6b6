"""The time-series join at its edges, as a user meets them: time columns of different types,
units and time zones, files of every odd shape, against the brute-force reference."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.models.join import join as join_model
from pipeline.timejoin import JoinInputError, StreamingJoin, join_tables
from tests.test_timejoin import reference_pairs

NS = 1_000_000_000
T0 = 1_793_527_200  # 2026-11-01T10:00:00Z, in seconds
LEFT_S = [0.0, 1.0, 1.0, 2.0, 7.0]  # a tie, and a large gap before the last record
RIGHT_S = [0.5, 1.5, 2.0, 30.0]
UNITS = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": NS}


def stamps(seconds: list[float], unit: str, tz: str | None = None) -> pa.Array:
    return pa.array([int((T0 + s) * UNITS[unit]) for s in seconds], pa.timestamp(unit, tz))


def series(times: pa.Array, tag: str) -> pa.Table:
    return pa.table({"time": times, "id": [f"{tag}{i}" for i in range(len(times))]})


def expected_ids(max_gap: float | None) -> list[tuple[str, str]]:
    return [(f"l{i}", f"r{j}") for i, j in reference_pairs(LEFT_S, RIGHT_S, max_gap)]


def ids(table: pa.Table) -> list[tuple[str, str]]:
    return list(zip(table["left_id"].to_pylist(), table["right_id"].to_pylist(), strict=True))


@pytest.mark.parametrize("gap", [None, 0.0, 0.5, 0.6, 5.0, 1e300])
@pytest.mark.parametrize(
    ("left_unit", "right_unit", "tz"),
    [("ns", "ms", None), ("s", "us", "UTC"), ("ms", "ms", None), ("us", "ns", "Europe/Berlin")],
)
def test_timestamps_of_any_unit_join_as_instants_with_max_gap_in_seconds(
    left_unit, right_unit, tz, gap
):
    left = series(stamps(LEFT_S, left_unit, tz), "l")
    right = series(stamps(RIGHT_S, right_unit, tz), "r")
    assert ids(join_tables(left, right, max_gap=gap).table) == expected_ids(gap)
    # The time columns come out as they went in.
    result = join_tables(left, right, max_gap=gap).table
    assert result["left_time"].type == left["time"].type
    assert result["right_time"].type == right["time"].type


def test_time_zones_of_the_two_series_may_differ_instants_are_compared():
    left = series(stamps(LEFT_S, "ns", "UTC"), "l")
    right = series(stamps(RIGHT_S, "ms", "America/New_York"), "r")
    assert ids(join_tables(left, right, max_gap=0.6).table) == expected_ids(0.6)


@pytest.mark.parametrize(
    ("left", "right", "shown"),
    [
        (stamps([0.0], "ns"), pa.array([0.5]), "timestamp[ns] in the left series, double in"),
        (pa.array([0], pa.int64()), stamps([0.5], "ms", "UTC"), "int64 in the left series"),
        (stamps([0.0], "ms"), stamps([0.5], "ms", "UTC"), "timestamp[ms, tz=UTC] in the right"),
    ],
    ids=["timestamp-vs-float", "int-vs-zoned", "naive-vs-zoned"],
)
def test_times_of_different_kinds_are_refused_not_compared(left, right, shown):
    with pytest.raises(JoinInputError, match=re.escape(shown)) as caught:
        join_tables(series(left, "l"), series(right, "r"))
    assert "not of one kind" in str(caught.value)


def test_timestamps_beyond_nanoseconds_are_refused():
    far = pa.array([40_000_000_000], pa.timestamp("s"))  # year 3237
    with pytest.raises(JoinInputError, match=re.escape("outside the years 1677-2262")):
        join_tables(series(far, "l"), series(stamps([0.0], "s"), "r"))


def test_streaming_join_of_timestamps_is_the_batch_join():
    left = series(stamps(LEFT_S, "ns"), "l")
    right = series(stamps(RIGHT_S, "ms"), "r")
    joiner = StreamingJoin(max_gap=0.6)
    out = [joiner.push("left", left.slice(0, 3)), joiner.push("right", right.slice(0, 2))]
    out += [joiner.push("left", left.slice(3)), joiner.push("right", right.slice(2))]
    out += [joiner.end("left"), joiner.end("right")]
    streamed = pa.concat_tables([t for t in out if t is not None])
    assert streamed.equals(join_tables(left, right, max_gap=0.6).table)
    assert ids(streamed) == expected_ids(0.6)


def test_streaming_join_refuses_a_batch_whose_times_are_of_another_kind():
    joiner = StreamingJoin()
    joiner.push("left", series(stamps([0.0], "ns"), "l"))
    with pytest.raises(JoinInputError, match=re.escape("double in the new right series")):
        joiner.push("right", series(pa.array([0.5]), "r"))
    with pytest.raises(JoinInputError, match=re.escape("timestamp[ns, tz=UTC] in the new left")):
        joiner.push("left", series(stamps([1.0], "ns", "UTC"), "l"))
    # The refused batches left nothing behind: the right series still joins.
    joiner.push("right", series(stamps([0.5], "ns"), "r"))
    assert joiner.end("left") is None
    assert ids(joiner.end("right")) == [("l0", "r0")]


def test_the_replay_model_takes_max_gap_in_seconds_for_datetime_columns():
    nanos = [T0 * NS + int(s * NS) for s in (0.0, 0.4, 1.0, 1.4, 3.0)]
    frame = pd.DataFrame(
        {
            "Interface": ["eth0", "wlan0", "eth0", "wlan0", "wlan0"],
            "TimestampNanos": nanos,
        }
    )
    as_ints = join_model(frame, max_gap_seconds=0.5)[1]
    dated = frame.assign(TimestampNanos=pd.to_datetime(frame["TimestampNanos"], utc=True))
    as_datetimes = join_model(dated, max_gap_seconds=0.5)[1]
    assert as_ints["pairs"] == 2  # eth0 0 s - wlan0 0.4 s, eth0 1 s - wlan0 1.4 s
    assert as_datetimes == as_ints
    huge = join_model(frame, max_gap_seconds=1e300)[1]  # no overflow to an infinite gap
    assert huge == join_model(frame)[1]


def test_the_replay_model_names_a_missing_split_column():
    frame = pd.DataFrame({"TimestampNanos": [1, 2]})
    with pytest.raises(JoinInputError, match=re.escape("it has no column 'Interface' to split")):
        join_model(frame)


# --- sluice join over files ------------------------------------------------------------------


def test_sluice_join_of_an_iso_csv_and_a_millisecond_parquet(tmp_path, capsys):
    """A CSV of ISO times is read as timestamp[s]; a Parquet file as timestamp[ms]."""
    lines = ["time,id"] + [
        f"{pd.Timestamp((T0 + s) * NS).isoformat()},l{i}" for i, s in enumerate(LEFT_S)
    ]
    (tmp_path / "left.csv").write_text("\n".join(lines) + "\n")
    pq.write_table(series(stamps(RIGHT_S, "ms"), "r"), tmp_path / "right.parquet")
    out = tmp_path / "pairs.parquet"
    argv = ["join", str(tmp_path / "left.csv"), str(tmp_path / "right.parquet"), "-o", str(out)]
    assert cli.main([*argv, "--max-gap", "0.6"]) == 0
    assert ids(pq.read_table(out)) == expected_ids(0.6)
    assert pa.types.is_timestamp(pq.read_table(out)["left_time"].type)


def test_sluice_join_refuses_a_naive_and_a_zoned_csv_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "naive.csv").write_text("time,v\n2026-11-01T10:00:00,1\n")
    (tmp_path / "zoned.csv").write_text("time,w\n2026-11-01T10:00:00Z,1\n")
    out = tmp_path / "pairs.parquet"
    argv = ["join", str(tmp_path / "naive.csv"), str(tmp_path / "zoned.csv"), "-o", str(out)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot join the two series: their 'time' times are not of one kind" in err
    assert "Traceback" not in err
    assert not out.exists()


def test_sluice_join_of_unsorted_files_with_duplicates_and_unicode_names(tmp_path, capsys):
    rng = np.random.default_rng(7)
    lt = rng.integers(0, 20, 40).astype(float)
    rt = rng.integers(0, 20, 25).astype(float)
    left = pa.table({"time": lt, "température": np.arange(40), "id": [f"l{i}" for i in range(40)]})
    right = pa.table({"time": rt, "température": np.arange(25), "id": [f"r{i}" for i in range(25)]})
    pq.write_table(left, tmp_path / "L.parquet")
    pq.write_table(right, tmp_path / "R.parquet")
    out = tmp_path / "out.parquet"
    argv = ["join", str(tmp_path / "L.parquet"), str(tmp_path / "R.parquet"), "-o", str(out)]
    assert cli.main([*argv, "--max-gap", "1"]) == 0
    got = pq.read_table(out)
    assert got.column_names == [
        "left_time",
        "left_température",
        "left_id",
        "right_time",
        "right_température",
        "right_id",
    ]
    # The reference numbers the records in time order, stably (file order for ties).
    lorder, rorder = np.argsort(lt, kind="stable"), np.argsort(rt, kind="stable")
    want = [
        (f"l{lorder[i]}", f"r{rorder[j]}")
        for i, j in reference_pairs(sorted(lt.tolist()), sorted(rt.tolist()), 1.0)
    ]
    assert ids(got) == want
