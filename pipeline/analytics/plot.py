"""`sluice plot rates`: an XY scatter chart of each NIC's rx/tx Mbit/s over time, per sample.

A scatter (not a line) so that uneven sampling does not distort time. Drawn with
matplotlib's Agg canvas on a `Figure` object (no pyplot global state, no display). More
samples than `max_points` are reduced to the maximum rate per time bucket and interface,
which keeps every burst visible (a plain subsample would drop the narrow ones); the title
says when that happened."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from pipeline import durable
from pipeline.analytics.rates import rates_sql
from pipeline.analytics.sandbox import open_database
from pipeline.analytics.sources import AnalyticsError, AnalyticsPaths, ExportSource
from pipeline.wording import counted

DEFAULT_MAX_POINTS = 200_000
#: The fewest points a chart over time is drawn with: a start and an end.
MIN_POINTS = 2
#: The columns a rate is computed from (`rates.py`)
NIC_COUNTERS = ("RemoteAddr", "Interface", "TimestampNanos", "RxBytes", "TxBytes")


@dataclass(frozen=True, slots=True)
class RatePlot:
    path: Path
    points: int
    samples: int
    bucket_ns: int | None


def _window_sql(view: str, start_ns: int | None, end_ns: int | None) -> str:
    where = []
    if start_ns is not None:
        where.append(f"TimestampNanos >= {int(start_ns)}")
    if end_ns is not None:
        where.append(f"TimestampNanos < {int(end_ns)}")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f'(SELECT * FROM "{view}"{clause})'


def _too_few(
    con: duckdb.DuckDBPyConnection,
    source: ExportSource,
    samples: int,
    start_ns: int | None,
    end_ns: int | None,
) -> str:
    """Why there is nothing to plot, and where Sluice looked."""
    if start_ns is not None or end_ns is not None:
        found = counted(samples, "sample")
        return f"{found} in the chosen window: a rate needs two; widen --from/--to"
    looked = con.execute(
        "SELECT location, files FROM sources WHERE kind = 'export' AND name = ?", [source.name]
    ).fetchall()
    where = ", ".join(
        f"{loc} ({counted(files, 'file')} at the last refresh)" for loc, files in looked
    )
    return (
        f"{counted(samples, 'sample')} exported: a rate needs two. "
        f"Sluice looked in {where or 'nowhere'}; "
        "export the stream there (`sluice run export`), then `sluice analytics refresh`"
    )


def _points(
    con: duckdb.DuckDBPyConnection, rates: str, samples: int, max_points: int
) -> tuple[dict[str, np.ndarray], int | None]:
    """The chart's points (one per NIC and time: its rx and tx rate), at most `max_points`:
    every sample's rate, or, for more samples, the maximum rate of each NIC per time bucket,
    the buckets shared out among the NICs (one bucket each at the least)."""
    if samples <= max_points:
        sql = (
            f"SELECT RemoteAddr || '/' || Interface AS nic, TimestampNanos AS t, rx_mbps, "
            f"tx_mbps FROM ({rates}) WHERE interval_s > 0 ORDER BY nic, t"
        )
        return con.sql(sql).fetchnumpy(), None
    bounds = (
        "SELECT min(TimestampNanos), max(TimestampNanos), "
        f"count(DISTINCT (RemoteAddr, Interface)) FROM ({rates})"
    )
    lo, hi, nics = con.sql(bounds).fetchall()[0]
    buckets = max(1, max_points // max(1, nics))  # per NIC
    bucket = (hi - lo) // buckets + 1  # so that [lo, hi] spans `buckets` of them at most
    sql = f"""
        SELECT RemoteAddr || '/' || Interface AS nic,
               {lo} + (TimestampNanos - {lo}) // {bucket} * {bucket} AS t,
               max(rx_mbps) AS rx_mbps, max(tx_mbps) AS tx_mbps
        FROM ({rates}) WHERE interval_s > 0 GROUP BY ALL ORDER BY nic, t
    """
    return con.sql(sql).fetchnumpy(), int(bucket)


def find_export(paths: AnalyticsPaths, known: list[ExportSource], name: str) -> ExportSource:
    """The export `name` names (its name, its stream or another name of it): one of `known`
    (sluice.toml's and the export runs' records: `discover_exports`), else one the last
    refresh read (`sluice analytics refresh --export SCOPE/STREAM=DIR` names it nowhere
    else), as the database's `sources` view lists it; else an `AnalyticsError` saying how to
    make it known."""
    source = next((s for s in known if s.matches(name)), None)
    refreshed = _refreshed_exports(paths, name) if source is None else []
    source = source or next((s for s in refreshed if s.matches(name)), None)
    if source is not None:
        return source
    names = dict.fromkeys(s.name for s in (*known, *refreshed))
    reason = (
        f"no export of it is known (known: {', '.join(names) or 'none'}); export it with "
        f"`sluice run export`, or include its directory with "
        f"`sluice analytics refresh --export {name}=DIR`"
    )
    msg = f"cannot plot {name}"
    raise AnalyticsError(msg, reason)


def _refreshed_exports(paths: AnalyticsPaths, name: str) -> list[ExportSource]:
    """The exports the last refresh made views of (none before the first refresh), each with
    its stream when it is `name` (read from its view: the `sources` view has no stream)."""
    if not paths.database.exists():
        return []
    with open_database(paths) as con:
        rows = con.execute(
            "SELECT name, directory FROM sources WHERE kind = 'export' ORDER BY name"
        ).fetchall()
        found = []
        for export, directory in rows:
            source = ExportSource(export, paths.resolve(directory))
            sql = f'SELECT 1 FROM "{source.view}" WHERE stream = ? LIMIT 1'
            if export != name and con.execute(sql, [name]).fetchall():
                source = ExportSource(export, source.root, name)
            found.append(source)
    return found


def plot_rates(
    paths: AnalyticsPaths,
    source: ExportSource,
    *,
    start_ns: int | None = None,
    end_ns: int | None = None,
    output: Path | None = None,
    max_points: int = DEFAULT_MAX_POINTS,
) -> RatePlot:
    """Write a PNG scatter of rx and tx Mbit/s over time for one exported stream (read from
    the database in its sandbox; the chart is the only file written), of at most
    `max_points` points (`MIN_POINTS` or more; more NICs than that: one point each)."""
    if max_points < MIN_POINTS:
        reason = f"--max-points is {max_points}: a chart over time needs {MIN_POINTS} or more"
        msg = f"cannot plot rates of {source.name}"
        raise AnalyticsError(msg, reason)
    if start_ns is not None and end_ns is not None and start_ns >= end_ns:
        reason = "--from must be before --to (the window holds nothing as given)"
        msg = f"cannot plot rates of {source.name}"
        raise AnalyticsError(msg, reason)
    with open_database(paths) as con:
        views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views()").fetchall()}
        if source.view not in views:
            reason = f"the database has no view {source.view!r}: run `sluice analytics refresh`"
            msg = f"cannot plot rates of {source.name}"
            raise AnalyticsError(msg, reason)
        columns = {c[0] for c in con.sql(f'SELECT * FROM "{source.view}" LIMIT 0').description}
        missing = [c for c in NIC_COUNTERS if c not in columns]
        if missing:
            reason = (
                f"its export has no {', '.join(missing)}: rates are drawn from network-card"
                f" counters ({', '.join(NIC_COUNTERS)}); query other data with `sluice sql`"
            )
            msg = f"cannot plot rates of {source.name}"
            raise AnalyticsError(msg, reason)
        window = _window_sql(source.view, start_ns, end_ns)
        samples = con.sql(f"SELECT count(*) FROM {window}").fetchall()[0][0]
        if samples < 2:
            msg = f"cannot plot rates of {source.name}"
            raise AnalyticsError(
                msg,
                _too_few(con, source, samples, start_ns, end_ns),
            )
        data, bucket = _points(con, rates_sql(window), samples, max_points)
    output = output or paths.plots_dir / f"{source.view}_rates.png"
    _draw(data, source.name, samples, bucket, output)
    return RatePlot(output, len(data["t"]), samples, bucket)


def _draw(data: dict, stream: str, samples: int, bucket: int | None, output: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    times = data["t"].astype("datetime64[ns]")
    nics = np.unique(data["nic"])
    for nic in nics:
        mine = data["nic"] == nic
        label = "" if len(nics) == 1 else f"{nic} "
        ax.scatter(times[mine], data["rx_mbps"][mine], s=3, label=f"{label}rx", alpha=0.7)
        ax.scatter(times[mine], data["tx_mbps"][mine], s=3, label=f"{label}tx", alpha=0.7)
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel("Mbit/s")
    title = f"{stream}: receive and transmit rate, {samples:,} samples"
    if bucket is not None:
        title += f" (max per {bucket / 1e6:g} ms)"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", markerscale=4)
    fig.autofmt_xdate()
    fig.tight_layout()
    with durable.atomic_path(output) as staging:
        fig.savefig(staging, format="png")
