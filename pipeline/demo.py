"""`make demo`: the whole pipeline for about a minute, run by Dagster's automation, then a summary.

    python -m pipeline.demo [--short] [--seconds N]

The collectors of sluice.toml run as the edge service (`sluice collect`: a NIC collector on
the busiest interface and a generator) while Dagster (`python -m assets.demo`, a child
process: `pipeline` never imports dagster) starts its daemon and turns every sensor and
schedule on: the tail sensor launches catch-ups, the new-slices sensor replays, the schedule
revalidates a replay, the automation-condition sensor refreshes the DuckDB views. Once the
collectors drain and stop and that work is done, the summary prints counts, what each sensor
and schedule launched, checks, replay metrics and a query. Everything is written under
`$SLUICE_HOME`; `make ui` opens the demo's Dagster instance to browse its runs and ticks."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import SluiceError
from pipeline.settings import SluiceSettings, load_settings
from pipeline.wording import counted

SYSFS_NET = Path("/sys/class/net")
PSC_PREFIX = "PRAVEGA_SENSOR_COLLECTOR_"


class DemoError(SluiceError):
    """A step of the demo failed; the message says which and where its log is."""

    def __init__(self, step: str, reason: str) -> None:
        self.step, self.reason = step, reason
        msg = f"demo step {step!r} failed: {reason}"
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """How long the collectors run; `--short` keeps the whole demo well under 3 minutes."""

    collect_seconds: float
    short: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DemoPlan:
        seconds = args.seconds if args.seconds is not None else (15.0 if args.short else 60.0)
        return cls(collect_seconds=float(seconds), short=bool(args.short))


# --- the edge: collectors -----------------------------------------------------------------


def interface_counters(sysfs: Path = SYSFS_NET) -> dict[str, int]:
    """rx + tx bytes so far of every interface this machine has."""
    traffic: dict[str, int] = {}
    for iface in sorted(p.name for p in sysfs.iterdir()) if sysfs.is_dir() else []:
        stats = sysfs / iface / "statistics"
        try:
            total = sum(int((stats / f).read_text()) for f in ("rx_bytes", "tx_bytes"))
        except (OSError, ValueError):
            continue
        traffic[iface] = total
    return traffic


def interface_traffic(sysfs: Path = SYSFS_NET, seconds: float = 1.0) -> dict[str, int]:
    """Bytes each interface moved during `seconds` (traffic now, not since boot)."""
    before = interface_counters(sysfs)
    time.sleep(seconds)
    after = interface_counters(sysfs)
    return {name: after[name] - before[name] for name in after if name in before}


def pick_interface(sysfs: Path = SYSFS_NET, busy_bytes: int = 1_000_000) -> str:
    """A non-loopback interface that moved over `busy_bytes` in a one-second probe (the
    busiest), else loopback, where the demo's own Spark traffic and bursts show."""
    traffic = interface_traffic(sysfs)
    if not traffic:
        step, reason = "pick a network interface", f"no interface statistics under {sysfs}"
        raise DemoError(step, reason)
    busy = {name: moved for name, moved in traffic.items() if name != "lo" and moved > busy_bytes}
    if busy:
        return max(sorted(busy), key=busy.__getitem__)
    return "lo" if "lo" in traffic else max(sorted(traffic), key=traffic.__getitem__)


def collector_environ(
    settings: SluiceSettings, interface: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """`[collectors.NAME]` of sluice.toml as the collector's instance variables
    (`PRAVEGA_SENSOR_COLLECTOR_<NAME>_<KEY>`), `interface = "auto"` resolved."""
    env = {k: v for k, v in environ.items() if not k.startswith(PSC_PREFIX)}
    step = "configure collectors"
    if not settings.collectors:
        reason = "sluice.toml has no [collectors.NAME] tables: the demo needs at least one"
        raise DemoError(step, reason)
    for name, table in sorted(settings.collectors.items()):
        if not isinstance(table, dict) or "driver" not in table:
            reason = f"[collectors.{name}] must be a table with a driver (nic, generator, ...)"
            raise DemoError(step, reason)
        prefix = f"{PSC_PREFIX}{name.upper()}_"
        for key, value in table.items():
            chosen = interface if key == "interface" and value == "auto" else value
            name_key = "CLASS" if key == "driver" else key.upper()
            env[prefix + name_key] = _env_text(chosen)
    return env


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


@contextmanager
def collectors_running(env: Mapping[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    """`sluice collect` for the length of the block; SIGTERM at the end lets it drain."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "collect", "--config", os.devnull],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        time.sleep(1.0)
        if proc.poll() is not None:
            step, reason = "start the collectors", f"exit status {proc.returncode} ({log_path})"
            raise DemoError(step, reason)
        yield proc
    finally:
        stop_process(proc, grace_seconds=60.0)
    if proc.returncode not in (0, -signal.SIGTERM):
        step, reason = "stop the collectors", f"exit status {proc.returncode} ({log_path})"
        raise DemoError(step, reason)


def stop_process(proc: subprocess.Popen, grace_seconds: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LoopbackBursts:
    """Bursts of real traffic over loopback while the NIC collector samples `lo`: every
    `period` seconds, `size` bytes through a TCP connection on 127.0.0.1, paced over
    `seconds` (a chunk every 10 ms), so that a burst lasts long enough for many samples to
    see it, as the bookmark's `min_samples` asks of a burst. On a quiet machine they give the
    bookmark job bursts to find (the collector measures them like any other traffic); on a
    busy interface the demo needs none."""

    TICK = 0.01

    def __init__(
        self, period: float = 4.0, size: int = 8 * 1024 * 1024, seconds: float = 1.5
    ) -> None:
        self.period, self.size, self.seconds = period, size, seconds
        self.stop = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.threads = [
            threading.Thread(target=self._drain, daemon=True),
            threading.Thread(target=self._send, daemon=True),
        ]

    def _drain(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            while conn.recv(1 << 20):
                pass

    def _send(self) -> None:
        ticks = max(1, round(self.seconds / self.TICK))
        chunk = b"\0" * (self.size // ticks)
        with socket.create_connection(self.server.getsockname()) as conn:
            while not self.stop.wait(self.period):
                for _ in range(ticks):
                    if self.stop.wait(self.TICK):
                        return
                    conn.sendall(chunk)

    def __enter__(self) -> LoopbackBursts:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.threads[1].join(timeout=10)
        self.threads[0].join(timeout=10)
        self.server.close()


# --- the cloud: Dagster ------------------------------------------------------------------


@contextmanager
def dagster_running(
    until: float, stopped: Path, summary: Path, log_path: Path, env: Mapping[str, str]
) -> Iterator[subprocess.Popen]:
    """`python -m assets.demo`: Dagster's daemon and automation, until `stopped` exists and
    the automation has caught up with the final tails."""
    for stale in (stopped, summary):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "assets.demo", "--until", str(until)]
    command += ["--stopped", str(stopped), "--summary", str(summary)]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(command, env=dict(env), stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None and not stopped.exists():
            stop_process(proc, grace_seconds=120.0)  # it stops its daemon on SIGTERM


def dagster_result(proc: subprocess.Popen, summary: Path, log_path: Path) -> dict[str, Any]:
    code = proc.wait()
    if code != 0 and summary.exists():  # what each sensor and schedule did before it failed
        print("\n".join(automation_lines(json.loads(summary.read_text()))), flush=True)
    if code != 0 or not summary.exists():
        step, reason = "run the automation", f"Dagster exited with {code} (see {log_path})"
        raise DemoError(step, reason)
    return json.loads(summary.read_text())


def wait_for_streams(settings: SluiceSettings, timeout: float) -> None:
    """Until the collectors' first commits created every family's edge stream."""
    from pipeline.streams import open_store

    deadline = time.monotonic() + timeout
    missing = [f.stream for f in settings.streams]
    while missing and time.monotonic() < deadline:
        time.sleep(0.5)
        still = []
        for family in settings.streams:
            with open_store(family.store_uri) as store:
                if not store.stream_exists(family.stream):
                    still.append(family.stream)
        missing = still
    if missing:
        step = "collect"
        reason = f"no events in {', '.join(missing)} after {timeout:.0f}s (see the collector log)"
        raise DemoError(step, reason)


# --- the summary ---------------------------------------------------------------------------


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


def print_summary(settings: SluiceSettings, dagster: dict[str, Any], plan: DemoPlan) -> None:
    from pipeline.analytics.sandbox import query
    from pipeline.analytics.sources import AnalyticsPaths
    from pipeline.cli.table import render

    paths = AnalyticsPaths(settings.home, settings.analytics_database)
    runs = dagster["runs"]
    checks = dagster["checks"]
    collected = f"{plan.collect_seconds:.0f} s of collection"
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


# --- the whole demo ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.demo", description=__doc__)
    parser.add_argument("--short", action="store_true", help="collect for 15 s (for CI)")
    parser.add_argument("--seconds", type=float, help="how long the collectors run")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    plan = DemoPlan.from_args(parse_args(argv))
    settings = load_settings()
    logs = settings.home / "demo"
    logs.mkdir(parents=True, exist_ok=True)
    interface = pick_interface()
    extra = " (with 8 MB loopback bursts of 1.5 s every 4 s)" if interface == "lo" else ""
    print(f"collecting for {plan.collect_seconds:.0f} s: NIC {interface}{extra} + generator")
    env = collector_environ(settings, interface, os.environ)
    until = time.time() + plan.collect_seconds
    stopped, summary = logs / "collectors.stopped", logs / "dagster-summary.json"
    dagster_log = logs / "dagster.log"
    with dagster_running(until, stopped, summary, dagster_log, os.environ) as dagster:
        bursts = LoopbackBursts() if interface == "lo" else contextlib.nullcontext()
        with collectors_running(env, logs / "collector.log"), bursts:
            wait_for_streams(settings, timeout=30.0)
            print("collectors are writing; Dagster's sensors catch up (mirror, exports, slices)")
            time.sleep(max(0.0, until - time.time()))
        stopped.touch()
        print(
            "collectors stopped; Dagster's automation: last catch-up, replays, a scheduled "
            "revalidation, analytics",
            flush=True,
        )
        result = dagster_result(dagster, summary, dagster_log)
    print_summary(settings, result, plan)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SluiceError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        sys.exit(1)
