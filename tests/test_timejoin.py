"""The time-series join: against a brute-force reference, over any arrival interleaving."""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import cli
from pipeline.timejoin import (
    JoinInputError,
    SeriesOutOfOrder,
    StreamingJoin,
    join_indices,
    join_tables,
)


def reference_pairs(lt: list[float], rt: list[float], max_gap: float | None) -> list[tuple]:
    """The definition, record by record (O(n*m)): nearest groups on both sides, both ways."""

    def nearest_both(t: float, other: list[float]) -> set[float]:
        before = [x for x in other if x <= t]
        after = [x for x in other if x >= t]
        return ({max(before)} if before else set()) | ({min(after)} if after else set())

    pairs = set()
    for i, tl in enumerate(lt):
        for j, tr in enumerate(rt):
            if tr in nearest_both(tl, rt) or tl in nearest_both(tr, lt):
                if max_gap is None or abs(tl - tr) <= max_gap:
                    pairs.add((i, j))

    def order(p: tuple[int, int]) -> tuple:
        i, j = p
        if lt[i] > rt[j]:
            return (lt[i], 0, i, j)
        return (rt[j], 1, j, i)

    return sorted(pairs, key=order)


times = st.lists(st.integers(0, 12).map(float), max_size=14).map(sorted)
gaps = st.none() | st.integers(0, 4).map(float)


@settings(max_examples=400, deadline=None)
@given(lt=times, rt=times, gap=gaps)
def test_matches_the_brute_force_reference(lt, rt, gap):
    pairs = join_indices(np.array(lt, dtype=np.float64), np.array(rt, dtype=np.float64), gap)
    got = list(zip(pairs.left.tolist(), pairs.right.tolist(), strict=True))
    assert got == reference_pairs(lt, rt, gap)
    assert len(set(got)) == len(got)  # every pair exactly once


def _series(ts: list[float], tag: str) -> pa.Table:
    return pa.table(
        {"time": pa.array(ts, pa.float64()), "id": [f"{tag}{i}" for i in range(len(ts))]}
    )


@st.composite
def interleavings(draw):
    """Two series, each cut into batches, the batches arriving in a random interleaving,
    and each series' end declared at a random point after its last batch."""
    lt, rt = draw(times), draw(times)
    steps = []
    for side, ts in (("left", lt), ("right", rt)):
        cuts = sorted(draw(st.lists(st.integers(0, len(ts)), max_size=4)))
        bounds = [0, *cuts, len(ts)]
        steps.append([(side, ts[a:b]) for a, b in itertools.pairwise(bounds)])
    merged = []
    left, right = steps
    while left or right:
        take_left = left and (not right or draw(st.booleans()))
        merged.append((left if take_left else right).pop(0))
        if take_left and not left:
            merged.append(("end-left", []))
        if not take_left and not right:
            merged.append(("end-right", []))
    return lt, rt, merged


@settings(max_examples=300, deadline=None)
@given(case=interleavings(), gap=gaps)
def test_any_arrival_interleaving_gives_the_batch_result(case, gap):
    lt, rt, steps = case
    joiner = StreamingJoin(max_gap=gap)
    out = []
    counters = {"left": 0, "right": 0}
    for what, ts in steps:
        if what.startswith("end-"):
            rows = joiner.end(what.removeprefix("end-"))
        else:
            start = counters[what]
            counters[what] += len(ts)
            batch = _series(lt if what == "left" else rt, what[0]).slice(start, len(ts))
            rows = joiner.push(what, batch)
        if rows is not None:
            out.append(rows)
    batch = join_tables(_series(lt, "l"), _series(rt, "r"), max_gap=gap).table
    streamed = pa.concat_tables(out) if out else batch.slice(0, 0)
    assert streamed.equals(batch)


def test_equal_times_pair_once_and_ends_pair_one_way():
    left = _series([1.0, 2.0, 5.0], "l")
    right = _series([0.0, 2.0, 9.0], "r")
    rows = join_tables(left, right).table.select(["left_id", "right_id"]).to_pylist()
    pairs = [(r["left_id"], r["right_id"]) for r in rows]
    assert pairs == [("l0", "r0"), ("l0", "r1"), ("l1", "r1"), ("l2", "r1"), ("l2", "r2")]
    assert pairs.count(("l1", "r1")) == 1


def test_ties_inside_a_series_pair_with_the_whole_group():
    left = _series([1.0, 4.5], "l")
    right = _series([0.0, 3.0, 3.0, 4.0, 5.0], "r")
    rows = join_tables(left, right).table.to_pylist()
    # l0: predecessor r0, successor group {r1, r2}, and r3's predecessor; r4's is l1.
    assert [r["right_id"] for r in rows if r["left_id"] == "l0"] == ["r0", "r1", "r2", "r3"]


def test_max_gap_drops_far_partners_without_taking_farther_ones():
    left = _series([0.0, 10.0], "l")
    right = _series([1.0, 4.0], "r")
    rows = join_tables(left, right, max_gap=2.0).table.to_pylist()
    # l0-r0 (1 s) stays; l1's nearest (r1, 6 s) is beyond the gap: l1 has no pair.
    assert [(r["left_id"], r["right_id"]) for r in rows] == [("l0", "r0")]
    result = join_tables(left, right, max_gap=2.0)
    assert (result.left_unmatched, result.right_unmatched) == (1, 1)


def test_empty_series_join_to_nothing_with_all_columns():
    result = join_tables(_series([], "l"), _series([1.0, 2.0], "r"))
    assert result.table.num_rows == 0
    assert result.table.column_names == ["left_time", "left_id", "right_time", "right_id"]
    assert result.right_unmatched == 2


def test_unsorted_input_is_sorted_stably_first():
    left = pa.table({"time": [3.0, 1.0], "id": ["late", "early"]})
    right = pa.table({"time": [2.0], "id": ["mid"]})
    rows = join_tables(left, right).table.to_pylist()
    assert [(r["left_id"], r["right_id"]) for r in rows] == [("early", "mid"), ("late", "mid")]


def test_nanosecond_integer_times_stay_exact():
    base = 1_700_000_000_000_000_000
    left = pa.table({"t": pa.array([base, base + 2], pa.int64())})
    right = pa.table({"t": pa.array([base + 1], pa.int64())})
    rows = join_tables(left, right, time_column="t", max_gap=1).table.to_pylist()
    assert [(r["left_t"] - base, r["right_t"] - base) for r in rows] == [(0, 1), (2, 1)]


def test_bad_inputs_are_refused_with_the_reason():
    good = _series([1.0], "r")
    with pytest.raises(JoinInputError, match=re.escape("has no column 'when'")):
        join_tables(_series([1.0], "l"), good, time_column="when")
    with pytest.raises(JoinInputError, match=re.escape("1 time(s) are NaN")):
        join_tables(_series([math.nan, 1.0], "l"), good)
    nulls = pa.table({"time": pa.array([None, 1.0], pa.float64())})
    with pytest.raises(JoinInputError, match=re.escape("1 record has no 'time'")):
        join_tables(nulls, good)
    with pytest.raises(JoinInputError, match="not in ascending order"):
        join_indices([2.0, 1.0], [1.0])


def test_a_series_going_back_in_time_is_refused():
    joiner = StreamingJoin()
    joiner.push("left", _series([1.0, 2.0], "l"))
    with pytest.raises(SeriesOutOfOrder, match=re.escape("went back in time (1.5 after 2.0)")):
        joiner.push("left", _series([1.5], "l"))


def test_streaming_buffers_stay_bounded():
    joiner = StreamingJoin()
    for k in range(200):
        joiner.push("left", _series([2.0 * k], "l"))
        joiner.push("right", _series([2.0 * k + 1], "r"))
    assert sum(t.num_rows for t in joiner._tables.values()) <= 4


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_sluice_join_command(tmp_path, monkeypatch, capsys, fmt):
    left = pa.table({"time": [0.0, 1.0, 2.0], "rx": [10, 11, 12]})
    right = pa.table({"time": [0.5, 1.5], "accel": [0.1, 0.2]})
    paths = []
    for name, table in (("left", left), ("right", right)):
        path = tmp_path / f"{name}.{fmt}"
        (pacsv.write_csv if fmt == "csv" else pq.write_table)(table, path)
        paths.append(str(path))
    out = tmp_path / "out" / "joined.parquet"
    assert cli.main(["join", *paths, "--output", str(out), "--max-gap", "0.6"]) == 0
    assert '"pairs": 4' in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert rows[0] == {"left_time": 0.0, "left_rx": 10, "right_time": 0.5, "right_accel": 0.1}
    assert [(r["left_rx"], r["right_accel"]) for r in rows] == [
        (10, 0.1),
        (11, 0.1),
        (11, 0.2),
        (12, 0.2),
    ]


def test_sluice_join_command_refuses_a_missing_file(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "nope.csv"
    assert cli.main(["join", str(missing), str(missing), "-o", str(tmp_path / "o.parquet")]) == 1
    assert f"cannot join {missing}: no such file" in capsys.readouterr().err
