"""Per-sample network rates of NIC exports, as SQL: rx/tx megabits per second since the
previous sample of the same NIC (the columns the Pravega Sensor Collector's NIC walkthrough
adds in a spreadsheet).

Window functions over each export's `RemoteAddr` + `Interface`, ordered by sample time then
stream position: the definition. A first sample or a zero interval gives NULL rates; a counter
that goes backwards (a reboot, a wrap) gives a NULL rate and `counter_reset`, never a huge
negative one (`DESIGN.md`, "Per-sample network rates"). A refresh computes them once per new
export file into the rates table (`rates_table.py`), which the `rates` view scans."""

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

#: The order of one NIC's samples: sample time, then stream position.
KEY = ("TimestampNanos", "_segment", "_offset", "_sample")
_WINDOW = f"PARTITION BY export, RemoteAddr, Interface ORDER BY {', '.join(KEY)}"


def _step(column: str) -> str:
    """A sample's value minus its previous one, as HUGEINT: two BIGINTs far apart (a clock at
    1900 then one at 2200, a counter that wraps) differ by more than a BIGINT holds, and DuckDB
    stops the whole query on the overflow."""
    return f"({column}::HUGEINT - lag({column}) OVER w)"


def _rate(counter: str) -> str:
    delta = _step(counter)
    seconds = f"(NULLIF({_step('TimestampNanos')}, 0) / 1e9)"
    return f"CASE WHEN {delta} < 0 THEN NULL ELSE {delta} * 8 / 1e6 / {seconds} END"


def rates_sql(relation: str, only: str | None = None) -> str:
    """SELECT computing the rates over `relation` (a table, view or parenthesized query with
    the NIC columns, `export`, `stream` and `time`); `only`, a condition on the relation's
    columns, keeps those rows after the rates are computed (the rates table's carried
    samples are previous samples, not rows)."""
    qualify = f"QUALIFY {only}" if only else ""
    return f"""
        SELECT export, stream, time, RemoteAddr, Interface, TimestampNanos,
               RxBytes, TxBytes,
               {_step("TimestampNanos")} / 1e9 AS interval_s,
               {_rate("RxBytes")} AS rx_mbps,
               {_rate("TxBytes")} AS tx_mbps,
               coalesce(RxBytes < lag(RxBytes) OVER w OR TxBytes < lag(TxBytes) OVER w, false)
                   AS counter_reset,
               _segment, _offset, _sample
        FROM {relation}
        WINDOW w AS ({_WINDOW})
        {qualify}
    """
