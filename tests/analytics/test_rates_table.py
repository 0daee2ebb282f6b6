"""The rates table: what the `rates` view scans is exactly the window-function definition
(`rates_sql`) over every exported file, however the files arrived; a refresh computes only the
new files, continuing each NIC from the last; late data, changed or lost files and a lost or
damaged table are recomputed, never trusted; reading writes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.analytics import rates_table
from pipeline.analytics.catalog import refresh
from pipeline.analytics.rates import rates_sql
from pipeline.analytics.sandbox import query
from pipeline.analytics.sources import AnalyticsPaths, ExportSource
from pipeline.settings import load_settings
from tests.analytics.conftest import HOUR_NS, T0

MS = 1_000_000
SAMPLES = 10  # per event
NICS = [("edge1", "eth0"), ("edge1", "wlan0"), ("edge2", "eth0")]
COLUMNS = (
    "export, stream, time, RemoteAddr, Interface, TimestampNanos, RxBytes, TxBytes, interval_s, "
    "rx_mbps, tx_mbps, counter_reset, _segment, _offset, _sample"
)
ORDER = "ORDER BY export, RemoteAddr, Interface, TimestampNanos, _segment, _offset, _sample"


class Exporter:
    """Writes NIC events in the export job's layout, one batch at a time: each batch's events
    go to one file per task and hour partition (`part-b<batch>-t<task>-f000.parquet`), events
    of one NIC run on across batches (counters keep counting, offsets keep growing)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.rng = np.random.default_rng(11)
        self.next_t = dict.fromkeys(NICS, T0 + HOUR_NS - 10_000 * MS)
        self.counter = dict.fromkeys(NICS, 0)
        self.offset = 0
        self.batch = 0

    def event(self, nic: tuple[str, str], start_ns: int | None = None) -> dict[str, np.ndarray]:
        t0 = self.next_t[nic] if start_ns is None else start_ns
        steps = self.rng.integers(50, 150, SAMPLES) * MS
        steps[self.rng.random(SAMPLES) < 0.1] = 0  # two samples at the same nanosecond
        t = t0 + np.cumsum(steps)
        rx = self.counter[nic] + np.cumsum(self.rng.integers(0, 50_000, SAMPLES))
        if self.rng.random() < 0.2:  # a reboot: the counter starts again
            rx[SAMPLES // 2 :] -= rx[SAMPLES // 2 - 1]
        if start_ns is None:
            self.next_t[nic], self.counter[nic] = int(t[-1]), int(rx[-1])
        self.offset += 100
        return {
            "RemoteAddr": np.full(SAMPLES, nic[0]),
            "Interface": np.full(SAMPLES, nic[1]),
            "TimestampNanos": t.astype(np.int64),
            "RxBytes": rx.astype(np.int64),
            "TxBytes": (rx // 7).astype(np.int64),
            "_segment": np.full(SAMPLES, NICS.index(nic) % 2, np.int64),
            "_offset": np.full(SAMPLES, self.offset, np.int64),
            "_sample": np.arange(SAMPLES, dtype=np.int64),
        }

    def write_batch(self, events_per_nic: int = 4, late: dict | None = None) -> list[Path]:
        """One export batch: `events_per_nic` events of every NIC over two tasks, and the
        `late` events ({nic: start_ns}) among them; returns the files it published."""
        events = [self.event(nic) for _ in range(events_per_nic) for nic in NICS]
        events += [self.event(nic, start) for nic, start in (late or {}).items()]
        written = []
        for task in (0, 1):
            mine = events[task::2]
            table = pa.table({k: np.concatenate([e[k] for e in mine]) for k in mine[0]})
            hours = (table["TimestampNanos"].to_numpy() - T0) // HOUR_NS
            for hour in np.unique(hours):
                part = table.filter(pa.array(hours == hour))
                folder = self.root / "date=2026-11-01" / f"hour={10 + int(hour):02d}"
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / f"part-b{self.batch:08d}-t{task:04d}-f000.parquet"
                pq.write_table(part, path)
                written.append(path)
        self.batch += 1
        return written


@pytest.fixture(autouse=True)
def _a_generation_per_refresh(monkeypatch):
    """These tables are tiny: keep every refresh's generation (none is merged), so that what
    each refresh computed can be seen; `test_small_generations_are_merged` sets it back."""
    monkeypatch.setattr(rates_table, "MERGE_BELOW", 0)


@pytest.fixture
def paths() -> AnalyticsPaths:
    return AnalyticsPaths.from_settings(load_settings())


@pytest.fixture
def exporter(tmp_path) -> Exporter:
    return Exporter(tmp_path / "export-network" / "parquet")


def network(exporter: Exporter) -> ExportSource:
    return ExportSource("network", exporter.root.parent, "examples/network", "NetworkSamples")


def refreshed(paths: AnalyticsPaths, exporter: Exporter) -> list[str]:
    lines: list[str] = []
    refresh(paths, [network(exporter)], lines.append)
    return lines


def table_rows(paths: AnalyticsPaths) -> list[tuple]:
    return query(paths, f"SELECT {COLUMNS} FROM rates {ORDER}")[1]


def definition_rows(paths: AnalyticsPaths) -> list[tuple]:
    """The window functions over every exported sample at once."""
    return query(paths, f"SELECT {COLUMNS} FROM ({rates_sql('network_samples')}) {ORDER}")[1]


def assert_as_defined(paths: AnalyticsPaths, samples: int) -> list[tuple]:
    rows = table_rows(paths)
    assert len(rows) == samples
    assert rows == definition_rows(paths)
    return rows


def table_dir(paths: AnalyticsPaths) -> Path:
    return paths.rates_dir / "network"


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_rates_are_the_definition_across_events_batches_files_and_refreshes(paths, exporter):
    for _ in range(3):  # three batches, each crossing into the next hour at some point
        exporter.write_batch()
    refreshed(paths, exporter)
    rows = assert_as_defined(paths, 3 * 4 * len(NICS) * SAMPLES)
    for _ in range(2):
        exporter.write_batch()
        refreshed(paths, exporter)
    rows = assert_as_defined(paths, 5 * 4 * len(NICS) * SAMPLES)
    # only the first sample of each NIC has no interval; every edge case is there
    assert sum(r[8] is None for r in rows) == len(NICS)
    assert any(r[11] for r in rows) and any(r[8] == 0 for r in rows)
    assert len({r[13] for r in rows}) > 1  # several events (offsets)
    hours = query(paths, "SELECT count(DISTINCT hour) FROM network")[1]
    assert hours == [(2,)]
    assert len(list(exporter.root.glob("date=*/hour=*/*.parquet"))) >= 10


def test_a_refresh_computes_only_the_new_files_and_continues_every_nic(paths, exporter):
    exporter.write_batch()
    exporter.write_batch()
    new = 4 * len(NICS) * SAMPLES
    first = refreshed(paths, exporter)
    assert first == [f"network: {2 * new:,} samples in 1 generation(s), {2 * new:,} computed now"]
    before = digests(table_dir(paths))
    sql = "SELECT RemoteAddr, Interface, max(TimestampNanos) FROM rates GROUP BY ALL"
    last = {(host, iface): t for host, iface, t in query(paths, sql)[1]}
    exporter.write_batch()
    lines = refreshed(paths, exporter)
    assert lines == [f"network: {3 * new:,} samples in 2 generation(s), {new:,} computed now"]
    after = digests(table_dir(paths))
    kept = {k: v for k, v in after.items() if k in before and k != "manifest.json"}
    assert kept == {k: v for k, v in before.items() if k != "manifest.json"}  # not rewritten
    assert_as_defined(paths, 3 * new)
    # each NIC's first sample of the new batch follows its last of the previous refresh
    for (host, iface), t in last.items():
        sql = (
            f"SELECT interval_s * 1e9, TimestampNanos FROM rates WHERE RemoteAddr = '{host}' "
            f"AND Interface = '{iface}' AND TimestampNanos > {t} "
            "ORDER BY TimestampNanos, _offset, _sample LIMIT 1"
        )
        [(interval_ns, t_next)] = query(paths, sql)[1]
        assert round(interval_ns) == t_next - t
    # a refresh with nothing new computes nothing and rewrites nothing
    assert refreshed(paths, exporter) == [
        f"network: {3 * new:,} samples in 2 generation(s), 0 computed now"
    ]
    assert digests(table_dir(paths)) == after


def test_late_data_recomputes_from_the_generation_it_reaches(paths, exporter):
    for _ in range(3):
        exporter.write_batch()
        refreshed(paths, exporter)
    # edge2/eth0 sends an event from the middle of its second batch (about 4 s each)
    early = exporter.next_t[("edge2", "eth0")] - 6000 * MS
    exporter.write_batch(late={("edge2", "eth0"): early})
    lines = refreshed(paths, exporter)
    assert lines[0] == (
        "network: recomputed from generation 1: late data for edge2/eth0 (a sample at or "
        "before one it had)"
    )
    assert lines[1].startswith(f"network: {(4 * 4 * len(NICS) + 1) * SAMPLES:,} samples in 2 ")
    assert_as_defined(paths, (4 * 4 * len(NICS) + 1) * SAMPLES)


def test_changed_or_removed_export_files_are_recomputed(paths, exporter):
    files = [exporter.write_batch() for _ in range(3)]
    refreshed(paths, exporter)
    exporter.write_batch()
    refreshed(paths, exporter)
    gone = files[1][0]
    gone.unlink()
    lines = refreshed(paths, exporter)
    assert f"export file {gone.relative_to(exporter.root).as_posix()} is gone" in lines[0]
    samples = query(paths, "SELECT count(*) FROM network")[1][0][0]
    assert_as_defined(paths, samples)
    rewritten = files[2][0]
    table = pq.read_table(rewritten)
    pq.write_table(table.slice(0, table.num_rows - 3), rewritten)
    lines = refreshed(paths, exporter)
    assert "changed" in lines[0]
    assert_as_defined(paths, samples - 3)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("delete a generation", "is missing or damaged"),
        ("garble a generation", "is missing or damaged"),
        ("delete a carry", "is missing or damaged"),
        ("delete the manifest", "its manifest is gone"),
        ("garble the manifest", "its manifest is unreadable"),
        ("delete the table", None),
    ],
)
def test_a_lost_or_damaged_table_is_rebuilt_not_trusted(paths, exporter, damage, reason):
    for _ in range(3):
        exporter.write_batch()
        refreshed(paths, exporter)
    samples = 3 * 4 * len(NICS) * SAMPLES
    directory = table_dir(paths)
    second = sorted(directory.glob("g*[0-9].parquet"))[1]
    if damage == "delete a generation":
        second.unlink()
    elif damage == "garble a generation":
        data = bytearray(second.read_bytes())
        data[-12:] = b"\0" * 12  # same size, footer gone
        second.write_bytes(bytes(data))
    elif damage == "delete a carry":
        sorted(directory.glob("*.carry.parquet"))[0].unlink()
    elif damage == "delete the manifest":
        (directory / "manifest.json").unlink()
    elif damage == "garble the manifest":
        (directory / "manifest.json").write_text('{"version": 1, "generat')
    else:
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
    lines = refreshed(paths, exporter)
    if reason is not None:
        assert reason in lines[0]
    assert_as_defined(paths, samples)
    # what the views no longer read is gone; what they read is all there
    files = {p.name for p in directory.iterdir()}
    assert len([f for f in files if f.endswith(".carry.parquet")]) == len(
        [f for f in files if not f.endswith("carry.parquet") and f.endswith(".parquet")]
    )


def test_reading_never_writes_the_table_and_stale_tables_go(paths, exporter, tmp_path):
    exporter.write_batch()
    refreshed(paths, exporter)
    before = digests(table_dir(paths))
    exporter.write_batch()  # a new file that no refresh has seen yet
    assert query(paths, "SELECT count(*) FROM rates")[1] == [(4 * len(NICS) * SAMPLES,)]
    assert digests(table_dir(paths)) == before
    assert query(paths, "SELECT kind, name, files FROM sources WHERE kind = 'rates'")[1] == [
        ("rates", "network", 1)
    ]
    refresh(paths, [])  # the export is no longer known: its table goes with its views
    assert not table_dir(paths).exists()
    assert query(paths, "SELECT count(*) FROM rates")[1] == [(0,)]


def test_small_generations_are_merged_with_the_next_new_files(paths, exporter, monkeypatch):
    batch = 4 * len(NICS) * SAMPLES
    monkeypatch.setattr(rates_table, "MERGE_BELOW", 2 * batch + 1)
    exporter.write_batch()
    refreshed(paths, exporter)
    exporter.write_batch()
    assert refreshed(paths, exporter) == [
        f"network: {2 * batch:,} samples in 1 generation(s), {2 * batch:,} computed now"
    ]
    exporter.write_batch()  # the last generation holds 2 batches, under the limit: merged
    assert refreshed(paths, exporter)[0].endswith(f"1 generation(s), {3 * batch:,} computed now")
    exporter.write_batch()  # now 3 batches: kept, the new one is a generation of its own
    assert refreshed(paths, exporter) == [
        f"network: {4 * batch:,} samples in 2 generation(s), {batch:,} computed now"
    ]
    assert_as_defined(paths, 4 * batch)
    assert len(list(table_dir(paths).iterdir())) == 2 * 2 + 1  # old generations swept
