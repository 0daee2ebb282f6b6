"""What `make demo` prints once its automation has finished (`pipeline/demo.py`): per stream
the samples collected, mirrored, exported and quarantined and the slices found; what each
Dagster sensor and schedule launched; checks, replays and revalidations; a DuckDB query over
the exports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.settings import SluiceSettings
from pipeline.wording import counted


@dataclass(frozen=True, slots=True)
class StreamCounts:
    name: str
    collected: int
    mirrored: int
    exported_rows: int
    quarantined: int
    slices: int


def stream_counts(settings: SluiceSettings, views: dict[str, int]) -> list[StreamCounts]:
    from pipeline.jobs.slices import list_slices
    from pipeline.streams import open_store

    counts = []
    for family in settings.streams:
        with open_store(family.store_uri) as edge, open_store(family.mirror_store_uri) as cloud:
            collected = edge.info(family.stream).events
            mirrored = cloud.info(family.mirror_stream).events
            slices = 0
            if family.bookmark is not None:
                found = list_slices(cloud, family.mirror_stream, family.bookmark.slices_stream)
                slices = len(found)
        counts.append(
            StreamCounts(
                family.name,
                collected,
                mirrored,
                views.get(family.name, 0),
                views.get(f"{family.name}_quarantine", 0),
                slices,
            )
        )
    return counts


def view_rows(settings: SluiceSettings) -> dict[str, int]:
    from pipeline.analytics.sandbox import query
    from pipeline.analytics.sources import AnalyticsPaths

    paths = AnalyticsPaths(settings.home, settings.analytics_database)
    rows = {}
    for family in settings.streams:
        for view in (family.name, f"{family.name}_quarantine"):
            rows[view] = int(query(paths, f'SELECT count(*) FROM "{view}"')[1][0][0])
    return rows


DEMO_QUERY = """
SELECT Interface, count(*) AS samples,
       round(avg(rx_mbps), 3) AS avg_rx_mbps, round(max(rx_mbps), 3) AS peak_rx_mbps,
       round(max(tx_mbps), 3) AS peak_tx_mbps
FROM rates GROUP BY Interface ORDER BY Interface
""".strip()


def automation_lines(dagster: dict[str, Any]) -> list[str]:
    """Per sensor and schedule: on or off, its ticks, and the runs it launched."""
    runs = {r["run_id"]: r for r in dagster["runs"]}
    pace = ", ".join(f"{k}={v}" for k, v in dagster["automation"].items())
    out = [f"\nDagster's automation (dagster-daemon; the demo's pace: {pace}):"]
    for item in dagster["launchers"]:
        ticks = item["ticks"]
        detail = ", ".join(f"{n} {status}" for status, n in sorted(ticks.items()))
        launched = item["runs"]
        out.append(
            f"  {item['kind']:<8} {item['name']}: {'on' if item['running'] else 'off'}, "
            f"{counted(sum(ticks.values()), 'tick')} ({detail or 'none'}), "
            f"{counted(len(launched), 'run')}"
        )
        out += [f"    {run_line(runs[run_id])}" for run_id in launched if run_id in runs]
    by_hand = [r for r in dagster["runs"] if r["launched_by"] == "manual"]
    out.append(f"  launched by hand: {counted(len(by_hand), 'run')}")
    out += [f"    {run_line(r)}" for r in by_hand]
    return out


def run_line(run: dict[str, Any]) -> str:
    """`run id  job [partition]  status  (why)  assets` of one run."""
    what = run["job"] + (f" {run['partition']}" if run["partition"] else "")
    if run["job"].startswith("__"):  # an asset selection, not a named job
        what = ", ".join(run["assets"])
    why = f"  ({run['reason']})" if run.get("reason") else ""
    return f"{run['run_id'][:8]}  {what:<40} {run['status']}{why}"


def revalidation_lines(dagster: dict[str, Any]) -> list[str]:
    out = [f"\nrevalidated by the schedule ({len(dagster['revalidations'])}):"]
    for r in dagster["revalidations"]:
        checked = f"run {r['run_id'][:8]} against run {(r['revalidates'] or '?')[:8]}"
        if not r["compared"]:
            verdict = "no earlier replay in this demo to compare with"
        elif r["differences"]:
            verdict = "DIFFERENT: " + ", ".join(
                f"{k} {a} -> {b}" for k, (a, b) in sorted(r["differences"].items())
            )
        else:
            verdict = "same cuts, counts, model version and metrics"
        out.append(f"  {r['slice_id']}  {r['asset']} ({checked}): {verdict}")
    return out


def print_summary(
    settings: SluiceSettings, dagster: dict[str, Any], collect_seconds: float
) -> None:
    """The demo's last words: counts per stream, what the automation did, checks, replays, a
    DuckDB query over the exports and where every file is."""
    from pipeline.analytics.sandbox import query
    from pipeline.analytics.sources import AnalyticsPaths
    from pipeline.cli.table import render

    paths = AnalyticsPaths(settings.home, settings.analytics_database)
    runs = dagster["runs"]
    checks = dagster["checks"]
    collected = f"{collect_seconds:.0f} s of collection"
    out = [f"\nSluice demo: {collected}, {counted(len(runs), 'Dagster run')}"]
    out.append("\nstream       collected  mirrored  exported rows  quarantined  slices")
    for c in stream_counts(settings, view_rows(settings)):
        out.append(
            f"{c.name:<12} {c.collected:>9}  {c.mirrored:>8}  {c.exported_rows:>13}"
            f"  {c.quarantined:>11}  {c.slices:>6}"
        )
    out += automation_lines(dagster)
    failed = sorted(name for name, ok in checks.items() if not ok)
    out.append(f"\nasset checks: {len(checks) - len(failed)}/{len(checks)} passed")
    out += [f"  not passed: {name}" for name in failed]
    out.append(f"\nreplays ({len(dagster['replays'])}):")
    for r in dagster["replays"]:
        bursts = r.get("metric/burst_periods", "-")
        peak = r.get("metric/peak_rx_mbps", "-")
        out.append(
            f"  {r['slice_id']}  {r['model']} {r['model_version']}: "
            f"{counted(r['input_rows'], 'row')} -> {counted(r['output_rows'], 'result')}, "
            f"burst periods {bursts}, peak rx {peak} Mbit/s"
        )
    out += revalidation_lines(dagster)
    columns, rows = query(paths, DEMO_QUERY)
    out.append(f"\nDuckDB over the Parquet exports ({paths.database}):\n{DEMO_QUERY}\n")
    out.append(render(columns, rows))
    plots = sorted(paths.plots_dir.glob("*.png"))
    out.append("\nfiles:")
    out.append(f"  streams      {settings.stores.get('edge')}  ->  {settings.stores.get('cloud')}")
    out.append(f"  exports      {settings.exports_dir}  (Parquet + CSV, date=/hour= partitions)")
    out.append(f"  replays      {settings.home / 'replays'}  (results, metrics, lineage)")
    out.append(f"  rate plot    {', '.join(str(p) for p in plots) or 'none (too few samples)'}")
    out.append(f"  analytics    {paths.database}")
    out.append(f"  dagster      {settings.dagster_home}")
    out.append(
        f"\nOpen the Dagster UI on http://127.0.0.1:3000 with:  make ui"
        f"   (DAGSTER_HOME={settings.dagster_home})"
    )
    print("\n".join(out), flush=True)
