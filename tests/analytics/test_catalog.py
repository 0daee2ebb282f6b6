"""The analytics database: views over exports, rates, quarantine, slices, lineage, replays."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cli
from pipeline.analytics.catalog import refresh
from pipeline.analytics.sandbox import query
from pipeline.analytics.snapshots import snapshot_slices
from pipeline.analytics.sources import (
    AnalyticsError,
    AnalyticsPaths,
    ExportSource,
    discover_exports,
    parse_export_option,
)
from pipeline.jobs.export import ExportSpec, record_export
from pipeline.jobs.replay import LineageRecord
from pipeline.jobs.slices import record_slices, time_window_slice
from pipeline.settings import load_settings
from tests.analytics.conftest import T0, nic_rows, write_export


@pytest.fixture
def paths() -> AnalyticsPaths:
    return AnalyticsPaths.from_settings(load_settings())


def network(root) -> ExportSource:
    return ExportSource("network", root, "examples/network", "NetworkSamples")


def test_rates_follow_the_spreadsheet_formula_per_interface(paths, nic_export):
    refresh(paths, [network(nic_export)])
    cols, rows = query(
        paths,
        "SELECT RemoteAddr, rx_mbps, tx_mbps, counter_reset FROM rates "
        "ORDER BY RemoteAddr, TimestampNanos, _sample",
    )
    assert cols == ["RemoteAddr", "rx_mbps", "tx_mbps", "counter_reset"]
    assert rows == [
        ("edge1", None, None, False),  # first sample of the NIC: no previous one
        ("edge1", 1.0, 0.0, False),  # 125,000 bytes in 1 s = 1 Mbit/s
        ("edge1", 1.0, 0.1, False),
        ("edge1", None, 0.1, True),  # rx counter went backwards: no rate, flagged
        ("edge2", None, None, False),
        ("edge2", 10.0, 0.0, False),
        ("edge2", 10.0, 0.0, False),
        ("edge2", 10.0, 0.0, False),
        ("edge2", None, None, False),  # same nanosecond as the previous sample
    ]


def test_samples_keep_partitions_and_lineage_columns(paths, nic_export):
    views = refresh(paths, [network(nic_export)])
    assert {"samples", "network", "network_samples", "rates"} <= set(views)
    _, rows = query(
        paths,
        "SELECT export, date::VARCHAR, hour, count(*), min(_offset) FROM samples GROUP BY ALL "
        "ORDER BY hour",
    )
    assert rows == [
        ("network", "2026-11-01", 10, 4, 0),
        ("network", "2026-11-01", 11, 5, 200),
    ]
    _, quarantined = query(paths, "SELECT export, _offset, reason FROM quarantine")
    assert quarantined == [("network", 4242, "arrays of unequal length")]
    # the kind of an export not named in sluice.toml is found by its columns
    refresh(paths, [ExportSource("net2", nic_export, "examples/network")])
    assert query(paths, "SELECT DISTINCT kind FROM samples")[1] == [("NetworkSamples",)]
    assert query(paths, "SELECT count(*) FROM network_samples")[1] == [(9,)]


def test_the_database_opens_in_plain_duckdb_without_sluice(paths, nic_export, tmp_path):
    refresh(paths, [network(nic_export)])
    script = (
        "import sys, duckdb\n"
        f"con = duckdb.connect({str(paths.database)!r}, read_only=True)\n"
        "print(con.sql('SELECT count(*), round(max(rx_mbps), 3) FROM rates').fetchall()[0])\n"
        "assert not any(m == 'pipeline' or m.startswith('pipeline.') for m in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "(9, 10.0)"


def test_views_exist_and_are_empty_before_any_file(paths):
    views = refresh(paths, [])
    fixed = ["samples", "rates", "quarantine", "slices", "slice_rows", "lineage", "replays"]
    assert set(fixed) <= set(views)
    for view in fixed:
        assert query(paths, f"SELECT count(*) FROM {view}")[1] == [(0,)]
    cols, _ = query(paths, "SELECT * FROM lineage")
    assert {"slice_id", "model_version", "start_cut", "input_rows"} <= set(cols)


def test_new_partitions_show_up_without_a_refresh(paths, nic_export):
    from tests.analytics.conftest import nic_rows, write_export

    refresh(paths, [network(nic_export)])
    later = T0 + 5 * 3_600_000_000_000
    write_export(nic_export, nic_rows("edge3", "wlan0", [later, later + 10**9], [0, 1], [0, 1]))
    assert query(paths, "SELECT count(*) FROM samples")[1] == [(11,)]


def test_slices_lineage_and_replays_views(paths, store, tmp_path):
    store.create_stream("examples/network")
    with store.writer("examples/network") as w:
        w.write(b'{"x": 1}', routing_key="edge1")
    now = 2_000_000_000_000_000_000
    record = time_window_slice(store, "examples/network", 0, now)
    record_slices(store, [record])
    snapshot_slices(paths, [(record, "sluice/slices")])
    results = paths.home / "replays" / "r" / "results.parquet"
    results.parent.mkdir(parents=True)
    pq.write_table(pa.table({"second": [1, 2], "rx_mbps": [0.5, 7.0]}), results)
    metrics = {"run_id": "run-1", "model": "pipeline.models.nic:throughput", "params": {}}
    (results.parent / "metrics.json").write_text(json.dumps(metrics))
    lineage = LineageRecord(
        run_id="run-1",
        slice_id=record.slice_id,
        stream="examples/network",
        sensor=None,
        start_cut=record.start_cut,
        end_cut=record.end_cut,
        start_time_ns=0,
        end_time_ns=now,
        input_events=1,
        input_rows=2,
        output_rows=2,
        model="pipeline.models.nic:throughput",
        model_version="sha256:abc",
        output_dir=str(results.parent),
        results_path=str(results),
        metrics_path=str(results.parent / "metrics.json"),
        started_at="2026-11-01T00:00:00Z",
        finished_at="2026-11-01T00:00:01Z",
        params_hash="sha256:" + "0" * 64,
    )
    lineage.write(paths.lineage_dir)
    refresh(paths, [])
    assert query(paths, "SELECT slice_id, stream, sensor FROM slices")[1] == [
        (record.slice_id, "examples/network", None)
    ]
    assert query(paths, "SELECT epoch_us(end_time) = end_time_ns // 1000 FROM slices")[1] == [
        (True,)
    ]
    assert query(paths, "SELECT run_id, input_events, model_version FROM lineage")[1] == [
        ("run-1", 1, "sha256:abc")
    ]
    assert query(paths, "SELECT slice_id, model, second, rx_mbps FROM replays ORDER BY 3")[1] == [
        (record.slice_id, "pipeline.models.nic:throughput", 1, 0.5),
        (record.slice_id, "pipeline.models.nic:throughput", 2, 7.0),
    ]
    # older results name their second as epoch seconds: `time` is made of it
    assert query(paths, "SELECT epoch(time) FROM replays ORDER BY 1")[1] == [(1.0,), (2.0,)]
    # a result's `time` that is no timestamp (a model of an older Sluice wrote nanoseconds)
    # is NULL, and never breaks the view for every other replay
    pq.write_table(
        pa.table({"time": [1_700_000_000_000_000_000, 7], "rx_mbps": [0.5, 7.0]}), results
    )
    refresh(paths, [])
    assert query(paths, "SELECT time, rx_mbps FROM replays ORDER BY 2")[1] == [
        (None, 0.5),
        (None, 7.0),
    ]


@pytest.fixture
def network_family(tmp_path, monkeypatch):
    """Settings with one family, `network`: `examples/network` mirrored to `cloud/network`."""
    config = tmp_path / "sluice.toml"
    config.write_text(
        '[streams.network]\nstream = "examples/network"\nschema = "NetworkSamples"\n'
        '[streams.network.mirror]\nstream = "cloud/network"\n'
        '[stores.cloud]\nembedded = "cloud-streams"\n'
    )
    monkeypatch.setenv("SLUICE_CONFIG", str(config))
    return load_settings()


def test_exports_come_from_sluice_toml_and_the_command_line(tmp_path, network_family):
    settings = network_family
    (tmp_path / "from-cli").mkdir()
    cli_export = parse_export_option(f"examples/accel={tmp_path / 'from-cli'}")
    found = {s.name: s for s in discover_exports(settings, [cli_export])}
    assert found["network"].root == settings.home / "exports" / "network"
    assert found["network"].matches("cloud/network") and found["network"].matches("network")
    assert (found["network"].stream, found["network"].schema) == ("cloud/network", "NetworkSamples")
    assert found["examples/accel"].root == tmp_path / "from-cli"
    assert AnalyticsPaths.from_settings(settings).database == (
        settings.home / "analytics" / "sluice.duckdb"
    )
    with pytest.raises(AnalyticsError, match=re.escape("expected SCOPE/STREAM=DIR")):
        parse_export_option("network")


def test_a_family_directory_holds_the_stream_its_export_recorded(network_family):
    """`sluice run export --stream examples/network` into the directory of the family that
    exports its mirror: the rows are positions of `examples/network` (the views once labelled
    them with the mirror's stream, and `slice_rows` found none of them)."""
    settings = network_family
    (family,) = settings.streams

    def found() -> ExportSource:
        return {s.name: s for s in discover_exports(settings)}["network"]

    assert found().stream == "cloud/network"  # nothing exported yet: the family's own
    edge = ExportSpec("examples/network", "NetworkSamples", family.export_dir, "embedded:x")
    record_export(edge, settings.home)
    network = found()
    assert (network.stream, network.view, network.root) == (
        "examples/network",
        "network",
        family.export_dir,
    )
    assert network.matches("cloud/network") and network.matches("network")
    other = ExportSpec("examples/other", "NetworkSamples", family.export_dir, "embedded:x")
    record_export(other, settings.home)  # two streams in one directory: no way to tell
    assert found().stream == "cloud/network"


def test_a_bad_query_is_one_clear_error(paths):
    refresh(paths, [])
    with pytest.raises(AnalyticsError, match=r"query failed: .*no_such_table"):
        query(paths, "SELECT * FROM no_such_table")


def test_sluice_sql_prints_a_table_and_json(monkeypatch, capsys, nic_export, store_dir):
    base = ["--store", f"embedded:{store_dir}"]
    export = ["--export", f"examples/network={nic_export}"]
    sql = (
        "SELECT RemoteAddr AS host, count(*) AS n, max(rx_mbps) AS peak FROM rates "
        "GROUP BY 1 ORDER BY 1"
    )
    assert cli.main([*base, "sql", sql]) == 1
    assert "no database there yet: build it with `sluice analytics refresh`" in (
        capsys.readouterr().err
    )
    assert cli.main([*base, "analytics", "refresh", *export]) == 0
    out = capsys.readouterr().out
    assert f"export:   examples/network <- {nic_export} (2 files)" in out
    assert cli.main([*base, "sql", sql]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["host", "n", "peak"]
    assert lines[2].split() == ["edge1", "4", "1.0"]
    assert lines[-1] == "(2 rows)"
    assert cli.main([*base, "sql", sql, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows[1] == {"host": "edge2", "n": 5, "peak": 10.0}
    assert cli.main([*base, "sql", "SELEC nothing"]) == 1
    assert capsys.readouterr().err.startswith("sluice: error: query failed: Parser Error")


def test_sluice_plot_rates_writes_a_png(capsys, nic_export, tmp_path):
    from pipeline.jobs.export import ExportSpec, record_export

    # an export run records where it wrote: nothing else names this directory
    record_export(ExportSpec("examples/network", "NetworkSamples", nic_export, "embedded:/x"))
    assert cli.main(["analytics", "refresh"]) == 0
    capsys.readouterr()
    out = tmp_path / "rates.png"
    argv = ["plot", "rates", "examples/network", "--output", str(out)]
    assert cli.main([*argv, "--from", "2026-11-01T10:59:58.5Z"]) == 0
    assert "(5 points from 8 samples)" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cli.main(["plot", "rates", "examples/nothing"]) == 1
    assert "cannot plot examples/nothing: no export of it is known" in capsys.readouterr().err
    swapped = ["--from", "2026-11-02T00:00Z", "--to", "2026-11-01T00:00Z"]
    assert cli.main([*argv, *swapped]) == 1
    assert "--from must be before --to" in capsys.readouterr().err
    assert cli.main(["analytics", "refresh", "--export", f"network={nic_export}"]) == 1
    assert "expected SCOPE/STREAM=DIR" in capsys.readouterr().err


def test_plot_rates_of_an_export_without_network_counters_says_so(capsys, tmp_path):
    from pipeline.jobs.export import ExportSpec, record_export

    rows = [
        {
            "RemoteAddr": "edge1",
            "Sensor": "sine",
            "TimestampNanos": T0 + i,
            "Sequence": i,
            "Value": float(i),
            "LastTimestampFormatted": None,
            "_segment": 0,
            "_offset": 0,
            "_sample": i,
        }
        for i in range(5)
    ]
    readings = write_export(tmp_path / "readings", rows)
    record_export(ExportSpec("site/readings", "GeneratorSamples", readings, "embedded:/x"))
    assert cli.main(["analytics", "refresh"]) == 0
    capsys.readouterr()
    assert cli.main(["plot", "rates", "site/readings"]) == 1
    err = capsys.readouterr().err
    assert (
        "cannot plot rates of site/readings: its export has no Interface, RxBytes, TxBytes" in err
    )
    assert "Traceback" not in err


def test_a_database_path_through_a_regular_file_is_one_clear_error(paths, tmp_path):
    (tmp_path / "afile").write_text("")
    database = AnalyticsPaths(paths.home, tmp_path / "afile" / "sluice.duckdb")
    with pytest.raises(AnalyticsError, match="afile: a regular file is where a directory"):
        refresh(database, [])


@pytest.mark.parametrize("damage", ["zeroed", "cut short"])
def test_a_damaged_database_says_to_move_it_away_and_refresh_again(paths, damage):
    refresh(paths, [])
    whole = paths.database.read_bytes()
    paths.database.write_bytes(bytes(5000) if damage == "zeroed" else whole[:4096])
    with pytest.raises(AnalyticsError, match="move it away and refresh again"):
        refresh(paths, [])
    paths.database.rename(paths.database.with_name("damaged.duckdb"))
    assert "samples" in refresh(paths, [])


def test_a_database_another_process_holds_names_the_lock(paths):
    refresh(paths, [])
    holder = (
        f"import duckdb, sys; c = duckdb.connect({str(paths.database)!r});"
        " print('held', flush=True); sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as other:
        assert other.stdout.readline() == "held\n"
        with pytest.raises(AnalyticsError, match="another process is using it"):
            refresh(paths, [])
        other.stdin.close()


def test_the_time_of_a_row_before_1970_is_rounded_down_as_its_partition_is():
    """A view's `time` is its row's event time in microseconds: rounded toward zero, -1 ns
    showed as 1970-01-01 00:00:00 while the row lies in the partition of 1969-12-31 hour 23."""
    import duckdb

    from pipeline.analytics.catalog import _time_expr
    from pipeline.schemas import flatten_plan

    expr = _time_expr(flatten_plan("NetworkSamples"), ["TimestampNanos"])
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    got = con.execute(
        f"SELECT strftime({expr}, '%Y-%m-%d %H:%M:%S.%f') FROM "
        "(VALUES (-1), (-1000), (-1001), (0), (1999)) AS t(TimestampNanos)"
    ).fetchall()
    assert [g for (g,) in got] == [
        "1969-12-31 23:59:59.999999",
        "1969-12-31 23:59:59.999999",
        "1969-12-31 23:59:59.999998",
        "1970-01-01 00:00:00.000000",
        "1970-01-01 00:00:00.000001",
    ]


def test_the_hour_partition_is_a_number_in_every_hour_of_the_day(paths, tmp_path):
    # DuckDB guessed the type from the folder names: `hour=04` made the whole column text
    hours = [T0 - 6 * 3600 * 10**9, T0 + 3600 * 10**9]  # 04:00 and 11:00 UTC
    root = write_export(tmp_path / "early", nic_rows("edge1", "eth0", hours, [0, 1], [0, 1]))
    refresh(paths, [network(root)])
    _, rows = query(paths, "SELECT typeof(hour), hour, typeof(date) FROM network ORDER BY hour")
    assert rows == [("BIGINT", 4, "DATE"), ("BIGINT", 11, "DATE")]
    _, rows = query(paths, "SELECT count(*) FROM network WHERE hour < 10")
    assert rows == [(1,)]
