"""Per-sample network rates: seed 000's calculated spreadsheet columns, as SQL.

The seed adds two columns to the exported NIC samples, received and transmitted megabits per
second since the previous sample of the same interface:

    rx_mbps = (RxBytes - previous RxBytes) * 8 / 1e6 / ((TimestampNanos - previous) / 1e9)

Here they are window functions over each `RemoteAddr` + `Interface` (one NIC of one host),
ordered by sample time and then stream position, so interleaved hosts never mix. Edge cases,
each visible rather than silently wrong:

- the first sample of an interface has no previous one: rates are NULL;
- two samples at the same nanosecond: the interval is 0, rates are NULL;
- a counter that goes backwards (a reboot, a driver reset, a 32-bit wrap): that rate is
  NULL and `counter_reset` is true, instead of a huge negative rate.
"""

from __future__ import annotations

NIC_COLUMNS = {
    "RemoteAddr": "VARCHAR",
    "Interface": "VARCHAR",
    "TimestampNanos": "BIGINT",
    "RxBytes": "BIGINT",
    "TxBytes": "BIGINT",
    "_segment": "BIGINT",
    "_offset": "BIGINT",
    "_sample": "BIGINT",
}

_WINDOW = "PARTITION BY RemoteAddr, Interface ORDER BY TimestampNanos, _segment, _offset, _sample"


def _rate(counter: str) -> str:
    delta = f"({counter} - lag({counter}) OVER w)"
    seconds = "(NULLIF(TimestampNanos - lag(TimestampNanos) OVER w, 0) / 1e9)"
    return f"CASE WHEN {delta} < 0 THEN NULL ELSE {delta} * 8 / 1e6 / {seconds} END"


def rates_sql(relation: str) -> str:
    """SELECT computing the rates over `relation` (a table, view or parenthesized query with
    the NIC columns and `export`)."""
    return f"""
        SELECT export, RemoteAddr, Interface, TimestampNanos,
               make_timestamp_ns(TimestampNanos) AS time,
               RxBytes, TxBytes,
               (TimestampNanos - lag(TimestampNanos) OVER w) / 1e9 AS interval_s,
               {_rate("RxBytes")} AS rx_mbps,
               {_rate("TxBytes")} AS tx_mbps,
               coalesce(RxBytes < lag(RxBytes) OVER w OR TxBytes < lag(TxBytes) OVER w, false)
                   AS counter_reset,
               _segment, _offset, _sample
        FROM {relation}
        WINDOW w AS ({_WINDOW})
    """
