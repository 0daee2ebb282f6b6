"""Odd export directories: names DuckDB would fold into one view, files that are not whole
Parquet, an export deleted since the last refresh. Each is a clear refusal or the right
numbers, never rows counted twice or missing without a word."""

from __future__ import annotations

import re
import shutil

import pytest

from pipeline.analytics.catalog import refresh
from pipeline.analytics.sandbox import query
from pipeline.analytics.sources import (
    AnalyticsError,
    AnalyticsPaths,
    ExportSource,
    UnreadableExportFiles,
    discover_exports,
    parse_export_option,
)
from pipeline.settings import load_settings
from tests.analytics.conftest import T0, nic_rows, write_export


@pytest.fixture
def paths() -> AnalyticsPaths:
    return AnalyticsPaths.from_settings(load_settings())


def export_of(tmp_path, directory: str, samples: int):
    times = [T0 + i * 1_000_000_000 for i in range(samples)]
    rows = nic_rows("edge1", "eth0", times, [1000 * i for i in range(samples)], [0] * samples)
    return write_export(tmp_path / directory, rows)


def per_export(paths: AnalyticsPaths) -> dict[str, int]:
    _, rows = query(paths, "SELECT export, count(*) FROM samples GROUP BY ALL")
    return dict(rows)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("site/network", "Site/Network"),  # one view name to DuckDB, which ignores case
        ("site/network", "site/network_quarantine"),  # the first one's quarantine view
    ],
)
def test_exports_whose_view_names_collide_in_duckdb_each_keep_their_rows(
    paths, tmp_path, first, second
):
    a, b = export_of(tmp_path, "a", 3), export_of(tmp_path, "b", 5)
    given = [parse_export_option(f"{first}={a}"), parse_export_option(f"{second}={b}")]
    exports = discover_exports(load_settings(), given)
    assert len({s.view.lower() for s in exports}) == 2
    refresh(paths, exports)
    assert sorted(per_export(paths).values()) == [3, 5]
    _, quarantined = query(paths, "SELECT count(*) FROM quarantine")
    assert quarantined == [(0,)]  # no export's samples shown as refused events


def test_two_views_of_one_name_are_refused_by_the_refresh_itself(paths, tmp_path):
    a, b = export_of(tmp_path, "a", 3), export_of(tmp_path, "b", 5)
    given = [
        ExportSource("Network", a, "x/a", "NetworkSamples"),
        ExportSource("network", b, "x/b", "NetworkSamples"),
    ]
    expected = (
        f"cannot build the views of {paths.database}: two views would be named 'Network' and "
        "'network' (DuckDB ignores case in names), and one would hide the other's rows: give "
        "one of the exports another name"
    )
    with pytest.raises(AnalyticsError, match=re.escape(expected)):
        refresh(paths, given)


def test_an_export_named_like_a_fixed_view_in_another_case_gets_its_own_view(paths, tmp_path):
    root = export_of(tmp_path, "a", 3)
    views = refresh(paths, [ExportSource("Rates", root, "x/rates", "NetworkSamples")])
    assert "Rates_export" in views
    assert query(paths, "SELECT count(*) FROM rates")[1] == [(3,)]
    assert query(paths, "SELECT count(*) FROM Rates_export")[1] == [(3,)]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda whole: b"", "0 bytes"),  # a file created and never written
        (lambda whole: whole[: len(whole) // 2], "bytes, no Parquet footer"),  # cut short
    ],
)
def test_a_file_that_is_not_whole_parquet_is_named_by_the_refresh(paths, tmp_path, damage, why):
    root = export_of(tmp_path, "a", 3)
    source = ExportSource("network", root, "x/network", "NetworkSamples")
    refresh(paths, [source])
    (good,) = root.glob("date=*/hour=*/*.parquet")
    bad = good.with_name("part-00001.parquet")
    bad.write_bytes(damage(good.read_bytes()))

    with pytest.raises(UnreadableExportFiles) as refused:
        refresh(paths, [source])
    assert refused.value.files[0][0] == bad
    message = str(refused.value)
    assert message.startswith(f"export network: {bad} is not a whole Parquet file (")
    assert why in message
    assert message.endswith(
        ": an export publishes whole files only, so it was damaged or put there by something "
        f"else; move it out of {root} (or restore it from a copy) and refresh again"
    )
    advice = "`sluice analytics refresh` names every such file; move them away"
    with pytest.raises(AnalyticsError, match=re.escape(advice)):
        query(paths, "SELECT count(*) FROM network")

    bad.unlink()  # the cause gone, the next refresh is whole again
    refresh(paths, [source])
    assert query(paths, "SELECT count(*) FROM network")[1] == [(3,)]


def test_an_export_deleted_since_the_refresh_says_to_refresh(paths, tmp_path):
    root = export_of(tmp_path, "a", 3)
    source = ExportSource("network", root, "x/network", "NetworkSamples")
    refresh(paths, [source])
    shutil.rmtree(root)
    advice = (
        "files a view read are gone since the last refresh, an export moved or deleted: run "
        "`sluice analytics refresh`"
    )
    with pytest.raises(AnalyticsError, match=re.escape(advice)):
        query(paths, "SELECT count(*) FROM samples")
    refresh(paths, [source])
    assert query(paths, "SELECT count(*) FROM samples")[1] == [(0,)]
