"""Fixtures for analytics: an export directory in the export job's layout.

The layout (hive partitions `date=`/`hour=`, the NIC columns plus `_segment`, `_offset`,
`_sample`, and a `_quarantine` table) is the export job's contract; the files are written here
with pyarrow so these tests do not need Spark.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HOUR_NS = 3_600_000_000_000
#: 2026-11-01T10:00:00Z
T0 = int(datetime(2026, 11, 1, 10, tzinfo=UTC).timestamp()) * 1_000_000_000


def nic_rows(host: str, iface: str, times_ns: list[int], rx: list[int], tx: list[int]) -> list:
    return [
        {
            "RemoteAddr": host,
            "Interface": iface,
            "TimestampNanos": t,
            "RxBytes": r,
            "TxBytes": x,
            "_segment": 0,
            "_offset": 100 * i,
            "_sample": i,
        }
        for i, (t, r, x) in enumerate(zip(times_ns, rx, tx, strict=True))
    ]


def write_export(root: Path, rows: list[dict], quarantine: list[dict] = ()) -> Path:
    """Write `rows` partitioned by the UTC date and hour of TimestampNanos."""
    by_part: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        moment = datetime.fromtimestamp(row["TimestampNanos"] / 1e9, tz=UTC)
        by_part.setdefault((f"{moment:%Y-%m-%d}", moment.hour), []).append(row)
    for (date, hour), part in by_part.items():
        folder = root / f"date={date}" / f"hour={hour:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(part), folder / "part-00000.parquet")
    if quarantine:
        (root / "_quarantine").mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.Table.from_pylist(list(quarantine)), root / "_quarantine" / "part-00000.parquet"
        )
    return root


@pytest.fixture(autouse=True)
def _no_sluice_toml(tmp_path, monkeypatch):
    """Analytics reads sluice.toml: point it at none, so tests see only what they set up."""
    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")


@pytest.fixture
def nic_export(tmp_path) -> Path:
    """Two NICs, interleaved in time, across an hour boundary; one counter reset; one
    repeated timestamp; one quarantined event."""
    ms = 1_000_000
    times = [T0 + HOUR_NS - 2000 * ms + k * 1000 * ms for k in range(4)]  # 10:59:58 .. 11:00:01
    a = nic_rows("edge1", "eth0", times, [0, 125_000, 250_000, 100], [0, 0, 12_500, 25_000])
    b = nic_rows(
        "edge2",
        "eth0",
        [t + 500 * ms for t in times] + [times[-1] + 500 * ms],
        [0, 1_250_000, 2_500_000, 3_750_000, 3_750_000],
        [0, 0, 0, 0, 0],
    )
    quarantine = [
        {"_segment": 0, "_offset": 4242, "reason": "arrays of unequal length", "payload": b"{}"}
    ]
    return write_export(tmp_path / "export-network", a + b, quarantine)
