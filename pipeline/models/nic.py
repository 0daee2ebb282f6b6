"""NIC throughput statistics over a slice: rates per second, bursts and idle periods.

Input: flattened NetworkSamples rows (`RemoteAddr`, `Interface`, `TimestampNanos`, `RxBytes`,
`TxBytes`). Per NIC (host + interface) and whole second of sample time (`time`, the start of
the second, a UTC timestamp): rx/tx Mbit/s and a state, `burst`, `idle` or `active`;
consecutive seconds of one state form a period. The
metrics are what one reads off a NIC rate chart (as in the Pravega Sensor Collector's NIC
walkthrough: "bursts every 10 to 15 seconds", "12 MB received"), as numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

NIC = ["RemoteAddr", "Interface"]
NS = 1_000_000_000


def _per_second(frame: pd.DataFrame) -> pd.DataFrame:
    ordered = frame.sort_values([*NIC, "TimestampNanos"], kind="stable")
    grouped = ordered.groupby(NIC, sort=False)
    rx = grouped["RxBytes"].diff().clip(lower=0).fillna(0)
    tx = grouped["TxBytes"].diff().clip(lower=0).fillna(0)
    seconds = ordered["TimestampNanos"] // NS
    deltas = pd.DataFrame(
        {
            "RemoteAddr": ordered["RemoteAddr"],
            "Interface": ordered["Interface"],
            "second": seconds,
            "rx_bytes": rx,
            "tx_bytes": tx,
        }
    )
    out = deltas.groupby([*NIC, "second"], sort=True).agg(
        samples=("rx_bytes", "size"), rx_bytes=("rx_bytes", "sum"), tx_bytes=("tx_bytes", "sum")
    )
    out = out.reset_index()
    time = pd.to_datetime(out.pop("second"), unit="s", utc=True).astype("datetime64[us, UTC]")
    out.insert(len(NIC), "time", time)
    return out


def _no_seconds() -> pd.DataFrame:
    """The result of an empty slice: no rows, the same columns and types as any other."""
    return pd.DataFrame(
        {
            "RemoteAddr": pd.Series([], dtype=object),
            "Interface": pd.Series([], dtype=object),
            "time": pd.Series([], dtype="datetime64[us, UTC]"),
            "samples": pd.Series([], dtype="int64"),
            "rx_bytes": pd.Series([], dtype="int64"),
            "tx_bytes": pd.Series([], dtype="int64"),
            "rx_mbps": pd.Series([], dtype="float64"),
            "tx_mbps": pd.Series([], dtype="float64"),
            "state": pd.Series([], dtype=object),
        }
    )


def _periods(states: pd.Series, nic_change: pd.Series) -> pd.Series:
    """A period number that grows whenever the state or the NIC changes."""
    return ((states != states.shift()) | nic_change).cumsum()


def throughput(
    frame: pd.DataFrame, burst_mbps: float = 50.0, idle_mbps: float = 0.1
) -> tuple[pd.DataFrame, dict]:
    """Rows per NIC and second; metrics over the whole slice.

    The byte counters are differenced sample to sample (a counter that goes backwards — a
    reboot or wrap — contributes nothing, as in the `rates` view) and summed per second; a
    second is `burst` when rx or tx is above `burst_mbps`, `idle` when both are at or below
    `idle_mbps`, else `active`. The metrics count burst and idle periods and give the peak and
    mean rates."""
    if frame.empty:
        return _no_seconds(), {"seconds": 0, "nics": 0, "burst_periods": 0, "idle_periods": 0}
    out = _per_second(frame)
    out["rx_mbps"] = out["rx_bytes"] * 8 / 1e6
    out["tx_mbps"] = out["tx_bytes"] * 8 / 1e6
    peak = np.maximum(out["rx_mbps"], out["tx_mbps"])
    out["state"] = np.where(
        peak > burst_mbps, "burst", np.where(peak <= idle_mbps, "idle", "active")
    )
    nic_change = (out[NIC] != out[NIC].shift()).any(axis=1)
    period = _periods(out["state"], nic_change)
    firsts = out.groupby(period)["state"].first()
    metrics = {
        "seconds": len(out),
        "nics": int(out[NIC].drop_duplicates().shape[0]),
        "burst_seconds": int((out["state"] == "burst").sum()),
        "idle_seconds": int((out["state"] == "idle").sum()),
        "burst_periods": int((firsts == "burst").sum()),
        "idle_periods": int((firsts == "idle").sum()),
        "peak_rx_mbps": round(float(out["rx_mbps"].max()), 6),
        "mean_rx_mbps": round(float(out["rx_mbps"].mean()), 6),
        "peak_tx_mbps": round(float(out["tx_mbps"].max()), 6),
        "rx_bytes": int(out["rx_bytes"].sum()),
        "tx_bytes": int(out["tx_bytes"].sum()),
    }
    out["rx_bytes"] = out["rx_bytes"].astype("int64")
    out["tx_bytes"] = out["tx_bytes"].astype("int64")
    return out, metrics
