"""NIC throughput statistics over a slice: rates per second, bursts and idle periods.

Input: flattened NetworkSamples rows (`RemoteAddr`, `Interface`, `TimestampNanos`, `RxBytes`,
`TxBytes`), as a pandas DataFrame or a pyarrow Table (`throughput.takes_arrow`: a replay
hands it the slice's Arrow rows without a pandas conversion). Per NIC (host + interface) and
whole second of sample time (`time`, the start of the second, a UTC timestamp): rx/tx Mbit/s
and a state, `burst`, `idle` or `active`; consecutive seconds of one state form a period. The
metrics are what one reads off a NIC rate chart (as in the Pravega Sensor Collector's NIC
walkthrough: "bursts every 10 to 15 seconds", "12 MB received"), as numbers.

The per-sample work (order by NIC and time, difference the counters, sum per second) is
numpy over the columns (`_per_second`); the grouped pandas definition it reproduces exactly
(`_per_second_frame`) runs for inputs numpy does not take as they are: text NIC names with
nulls, counters or times that are not 64-bit integers, or nulls among them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from collections.abc import Sequence

NIC = ["RemoteAddr", "Interface"]
COUNTERS = ["RxBytes", "TxBytes"]
NS = 1_000_000_000
#: NICs up to this many are split one by one (a pass each); more are sorted by code.
SPLIT_NICS = 16


def _per_second_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The definition: samples per NIC in time order, counters differenced, summed per second."""
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
    return out.reset_index()


def _per_second(data: pd.DataFrame | pa.Table) -> pd.DataFrame | None:
    """`_per_second_frame`'s rows (RemoteAddr, Interface, second, samples, rx_bytes,
    tx_bytes) computed over numpy arrays: NICs as sorted codes, each NIC's samples picked out
    in stream order (a stable sort by time only where they are not in time order already),
    counters differenced as floats (as pandas does: `float(a) - float(b)`) and summed per
    second. The sums are of whole numbers, exact (below 2^53) in any order, so equal to
    pandas' grouped sums. None for a table of other types (a DataFrame of them goes to
    `_per_second_frame`)."""
    columns = _numeric_columns(data)
    nic = _nic_codes(data) if columns is not None else None
    if columns is None or nic is None:
        return _per_second_frame(data) if isinstance(data, pd.DataFrame) else None
    times, rx, tx = columns
    starts, parts = [], []
    for picked in _rows_per_nic(nic):
        rows, time = picked, times[picked]
        if not _ascending(time):
            order = np.argsort(time, kind="stable")
            rows, time = picked[order], time[order]
        second = time // NS
        first = np.flatnonzero(np.concatenate([[True], second[1:] != second[:-1]]))
        starts.append(rows[first])
        parts.append(
            (
                second[first],
                np.diff(np.append(first, len(rows))),
                _sums(rx[rows], first),
                _sums(tx[rows], first),
            )
        )
    first_rows = np.concatenate(starts)
    second, samples, rx_bytes, tx_bytes = (np.concatenate(p) for p in zip(*parts, strict=True))
    return pd.DataFrame(
        {
            "RemoteAddr": _values_at(data, "RemoteAddr", first_rows),
            "Interface": _values_at(data, "Interface", first_rows),
            "second": second,
            "samples": samples.astype(np.int64),
            "rx_bytes": rx_bytes,
            "tx_bytes": tx_bytes,
        }
    )


def _sums(counter: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per second (rows from each of `first`), the sum of the counter's increases: each
    sample's value less the previous one's, as floats, a decrease counting 0."""
    values = counter.astype(np.float64)
    deltas = np.empty_like(values)
    deltas[0] = 0.0
    np.subtract(values[1:], values[:-1], out=deltas[1:])
    np.maximum(deltas, 0.0, out=deltas)
    return np.add.reduceat(deltas, first)


def _rows_per_nic(nic: np.ndarray) -> Sequence[np.ndarray]:
    """The row numbers of each NIC, in code order; each NIC's in stream order."""
    present = np.flatnonzero(np.bincount(nic))
    if len(present) <= SPLIT_NICS:
        return [np.flatnonzero(nic == code) for code in present]
    order = np.argsort(nic, kind="stable")
    bounds = np.searchsorted(nic[order], present[1:])
    return np.split(order, bounds)


def _ascending(values: np.ndarray) -> bool:
    return len(values) < 2 or bool((values[1:] >= values[:-1]).all())


def _numeric_columns(data: pd.DataFrame | pa.Table) -> list[np.ndarray] | None:
    """TimestampNanos, RxBytes and TxBytes as int64 arrays; None unless all are 64-bit
    integers without nulls."""
    out = []
    for name in ("TimestampNanos", *COUNTERS):
        if isinstance(data, pa.Table):
            column = data.column(name)
            if column.type != pa.int64() or column.null_count:
                return None
            out.append(column.to_numpy())
        else:
            column = data[name]
            if column.dtype != np.int64:
                return None
            out.append(column.to_numpy())
    return out


def _nic_codes(data: pd.DataFrame | pa.Table) -> np.ndarray | None:
    """Each row's NIC as a code in (RemoteAddr, Interface) order; None when a name is not
    text or is null. Dictionary columns over one indices array (a replay's per-event
    columns) are combined per entry, then gathered once."""
    encoded = [_encoded(data, name) for name in NIC]
    if encoded[0] is None or encoded[1] is None:
        return None
    (host_rows, host), (interface_rows, interface) = encoded
    ranks = [_entry_ranks(host.dictionary), _entry_ranks(interface.dictionary)]
    if ranks[0] is None or ranks[1] is None:
        return None
    (hosts, _), (interfaces, count) = ranks
    if _same_buffer(host_rows, interface_rows):
        return (hosts * count + interfaces)[host_rows.to_numpy()]
    return hosts[host_rows.to_numpy()] * count + interfaces[interface_rows.to_numpy()]


def _same_buffer(a: pa.Array, b: pa.Array) -> bool:
    return a.offset == b.offset and a.buffers()[1].address == b.buffers()[1].address


def _encoded(data: pd.DataFrame | pa.Table, name: str) -> tuple[pa.Array, pa.Array] | None:
    """(the column's dictionary indices, its dictionary array); None unless it is text
    (plain or dictionary-encoded) without nulls."""
    if isinstance(data, pa.Table):
        array = data.column(name).combine_chunks()
    elif isinstance(data[name].dtype, pd.StringDtype):
        array = pa.array(data[name])
        array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    else:
        return None
    if array.null_count or not len(array):
        return None
    if not pa.types.is_dictionary(array.type):
        array = pc.dictionary_encode(array) if _is_text(array.type) else None
    if array is None or not _is_text(array.type.value_type):
        return None
    return array.indices, array


def _entry_ranks(dictionary: pa.Array) -> tuple[np.ndarray, int] | None:
    """(each dictionary entry's rank among the distinct values in sorted order, how many
    distinct values there are: a dictionary may repeat values); None when one is null."""
    entries = pc.dictionary_encode(dictionary)
    distinct = entries.dictionary
    if distinct.null_count:
        return None
    rank = np.empty(len(distinct), np.int64)
    rank[pc.sort_indices(distinct).to_numpy()] = np.arange(len(distinct))
    return rank[entries.indices.to_numpy()], len(distinct)


def _is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _values_at(data: pd.DataFrame | pa.Table, name: str, rows: np.ndarray) -> pd.Series:
    """The column's values at `rows`, as pandas gives them (its text type)."""
    if isinstance(data, pd.DataFrame):
        return data[name].iloc[rows].reset_index(drop=True)
    values = data.column(name).take(pa.array(rows))
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    return pd.Series(values.to_pylist())


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
    frame: pd.DataFrame | pa.Table, burst_mbps: float = 50.0, idle_mbps: float = 0.1
) -> tuple[pd.DataFrame, dict]:
    """Rows per NIC and second; metrics over the whole slice.

    The byte counters are differenced sample to sample (a counter that goes backwards — a
    reboot or wrap — contributes nothing, as in the `rates` view) and summed per second; a
    second is `burst` when rx or tx is above `burst_mbps`, `idle` when both are at or below
    `idle_mbps`, else `active`. The metrics count burst and idle periods and give the peak and
    mean rates. Given a table it does not take (see the module doc), it returns
    `NotImplemented`, and the replay hands it the slice as a DataFrame instead."""
    if frame.num_rows == 0 if isinstance(frame, pa.Table) else frame.empty:
        return _no_seconds(), {"seconds": 0, "nics": 0, "burst_periods": 0, "idle_periods": 0}
    out = _per_second(frame)
    if out is None:
        return NotImplemented
    time = pd.to_datetime(out.pop("second"), unit="s", utc=True).astype("datetime64[us, UTC]")
    out.insert(len(NIC), "time", time)
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


#: A replay hands this model the slice's Arrow rows (`pipeline.models`).
throughput.takes_arrow = True
