"""`make demo`: the whole pipeline for about a minute, run by Dagster's automation, then a summary.

    python -m pipeline.demo [--short] [--seconds N]

The collectors of sluice.toml run as the edge service (`sluice collect`: a NIC collector on
the busiest interface and a generator) while Dagster (`python -m assets.demo`, a child
process: `pipeline` never imports dagster) starts its daemon and turns every sensor and
schedule on: the tail sensor launches catch-ups, the new-slices sensor replays, the schedule
revalidates a replay, the automation-condition sensor refreshes the DuckDB views. Once the
collectors drain and stop and that work is done, the summary prints counts, what each sensor
and schedule launched, checks, replay metrics and a query. Everything is written under
`$SLUICE_HOME`; `make ui` opens the demo's Dagster instance to browse its runs and ticks.

Each demo starts clean: it holds `$SLUICE_HOME/demo/lock` while it (or a process it started)
runs, removes what an earlier demo left in the home (never a home the demo did not write), and
on Ctrl-C or SIGTERM stops its collectors, Dagster and the warm Spark it started before it
exits. Its children get SIGTERM should it be killed outright (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.demo_summary import automation_lines, print_summary
from pipeline.errors import SluiceError
from pipeline.settings import SluiceSettings, load_settings

SYSFS_NET = Path("/sys/class/net")
PSC_PREFIX = "PRAVEGA_SENSOR_COLLECTOR_"
#: Free space the demo asks for under $SLUICE_HOME: a 15 s demo writes about 8 MB, a 60 s
#: one about 25 MB (streams, collector buffers, exports, Dagster's runs and logs).
MIN_FREE_BYTES = 64 * 1024 * 1024
#: What a demo writes under the home besides the stores, exports, analytics database and
#: Dagster instance that sluice.toml names; `spark/` (the warm Spark's state) is left alone.
DEMO_DIRS = ("checkpoints", "collector", "lineage", "plots", "registry", "replays")
#: Files of `<home>/demo` that only the demo writes: a home that holds one is a demo's.
DEMO_FILES = ("lock", "collector.log", "dagster.log", "dagster-summary.json")
NEW_HOME = "set SLUICE_HOME to a new directory (SLUICE_HOME=/tmp/sluice-demo make demo)"
_PR_SET_PDEATHSIG = 1


class DemoError(SluiceError):
    """A step of the demo failed; the message says which and where its log is."""

    def __init__(self, step: str, reason: str) -> None:
        self.step, self.reason = step, reason
        msg = f"demo step {step!r} failed: {reason}"
        super().__init__(msg)


class DemoInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM: raised in the main thread, so that every process the demo started
    is stopped on the way out (the `with` blocks of `main`)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """How long the collectors run; `--short` keeps the whole demo well under 3 minutes."""

    collect_seconds: float
    short: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DemoPlan:
        seconds = args.seconds if args.seconds is not None else (15.0 if args.short else 60.0)
        return cls(collect_seconds=float(seconds), short=bool(args.short))


# --- the home: one demo at a time, each from a clean start ---------------------------------


def demo_outputs(settings: SluiceSettings) -> list[Path]:
    """What a demo writes under the home that is there now: the embedded stores, exports,
    analytics database and Dagster instance of sluice.toml, and `DEMO_DIRS`."""
    home = settings.home
    paths = {home / name for name in DEMO_DIRS}
    paths |= {settings.dagster_home, settings.exports_dir, settings.analytics_database}
    paths.add(settings.analytics_database.parent)
    for uri in settings.stores.values():
        if uri.startswith("embedded:"):
            paths.add(Path(uri.removeprefix("embedded:")))
    inside = {p for p in paths if p != home and p.is_relative_to(home)}
    return sorted(p for p in inside if p.exists() or p.is_symlink())


def start_clean(settings: SluiceSettings, was_demo: bool, outputs: list[Path]) -> None:
    """Remove what an earlier demo left (`outputs`, its logs), so that this one's counts,
    slices and runs are its own; a home with outputs no demo wrote is refused, untouched."""
    home, logs = settings.home, settings.home / "demo"
    if outputs and not was_demo:
        names = ", ".join(str(p.relative_to(home)) for p in outputs)
        reason = (
            f"{home} holds Sluice data that no demo wrote ({names}); the demo starts from an "
            f"empty home and does not delete it: {NEW_HOME}"
        )
        step = "prepare SLUICE_HOME"
        raise DemoError(step, reason)
    for path in outputs:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    for log in logs.iterdir():
        if log.name != "lock" and not log.is_dir():
            log.unlink()
    if outputs:
        print(
            f"starting clean: removed the previous demo's streams, exports, replays and "
            f"Dagster runs under {home}",
            flush=True,
        )


def free_bytes(path: Path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


@contextmanager
def home_held(settings: SluiceSettings) -> Iterator[int]:
    """The demo's lock on the home (`<home>/demo/lock`, an fd its children inherit, so that
    a demo killed outright holds the home until its processes have stopped), the home
    cleaned of an earlier demo and checked for free space; the lock's fd."""
    home, logs = settings.home, settings.home / "demo"
    step = "prepare SLUICE_HOME"
    was_demo = any((logs / name).exists() for name in DEMO_FILES)
    outputs = demo_outputs(settings)
    try:
        logs.mkdir(parents=True, exist_ok=True)
        fd = os.open(logs / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        reason = (
            f"cannot write under {home} ({exc.strerror}): {NEW_HOME.replace('new', 'writable')}"
        )
        raise DemoError(step, reason) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            reason = (
                f"another demo is running on {home}, or its collectors and Dagster are still "
                f"stopping: wait for it to end, or {NEW_HOME}"
            )
            raise DemoError(step, reason) from None
        start_clean(settings, was_demo, outputs)
        if (free := free_bytes(home)) < MIN_FREE_BYTES:
            reason = (
                f"only {free // 1024 // 1024} MB free on the disk of {home}; the demo needs "
                f"{MIN_FREE_BYTES // 1024 // 1024} MB: free some space, or set SLUICE_HOME to a "
                "directory on another disk"
            )
            raise DemoError(step, reason)
        yield fd
    finally:
        os.close(fd)


def disk_full_hint(home: Path) -> str:
    """`; the disk of HOME is full ...` when less than a MiB is free there, else empty."""
    with contextlib.suppress(OSError):
        if free_bytes(home) < 1024 * 1024:
            return f"; the disk of {home} is full: free some space and run the demo again"
    return ""


def demo_environ(settings: SluiceSettings, environ: Mapping[str, str]) -> dict[str, str]:
    """The children's environment: this home and this sluice.toml, as absolute paths, so
    that every process reads the same whatever its working directory."""
    env = {**environ, "SLUICE_HOME": str(settings.home)}
    if settings.source is not None:
        env["SLUICE_CONFIG"] = str(settings.source.absolute())
    return env


def child_options(lock_fd: int) -> dict[str, Any]:
    """`Popen` options of the demo's children: a session of their own (the terminal's Ctrl-C
    is the demo's to handle: one SIGTERM each, in order), the home's lock, and SIGTERM
    should the demo die without stopping them."""
    return {"start_new_session": True, "pass_fds": (lock_fd,), "preexec_fn": _die_with_demo()}


def _die_with_demo() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    libc, parent = ctypes.CDLL(None, use_errno=True), os.getpid()

    def set_death_signal() -> None:  # in the child, between fork and exec
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the demo died before prctl
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


@contextmanager
def warm_spark(enabled: bool, env: Mapping[str, str]) -> Iterator[None]:
    """`sluice spark start` for the length of the block, stopped at its end; a server that
    runs for this home already is used and left running."""
    if not enabled:
        yield
        return
    spark = [sys.executable, "-m", "pipeline.cli", "spark"]
    quiet = {"env": dict(env), "stdout": subprocess.DEVNULL}
    if subprocess.run([*spark, "status"], check=False, **quiet).returncode == 0:
        print("using the warm Spark already running for this home (left running)", flush=True)
        yield
        return
    try:
        if subprocess.run([*spark, "start"], check=False, **quiet).returncode != 0:
            print("demo: warning: no warm Spark: each job starts its own", file=sys.stderr)
        yield
    finally:  # also a start interrupted halfway
        subprocess.run([*spark, "stop"], check=False, **quiet)


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
def collectors_running(
    env: Mapping[str, str], log_path: Path, lock_fd: int
) -> Iterator[subprocess.Popen]:
    """`sluice collect` for the length of the block; SIGTERM at the end lets it drain."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "collect", "--config", os.devnull],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            **child_options(lock_fd),
        )
    try:
        time.sleep(1.0)
        if proc.poll() is not None:
            step, reason = "start the collectors", f"exit status {proc.returncode} ({log_path})"
            raise DemoError(step, reason)
        yield proc
    finally:
        stop_process(proc, grace_seconds=60.0)
    if proc.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
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
    until: float,
    stopped: Path,
    summary: Path,
    log_path: Path,
    env: Mapping[str, str],
    *,
    lock_fd: int,
) -> Iterator[subprocess.Popen]:
    """`python -m assets.demo`: Dagster's daemon and automation, until `stopped` exists and
    the automation has caught up with the final tails."""
    for stale in (stopped, summary):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "assets.demo", "--until", str(until)]
    command += ["--stopped", str(stopped), "--summary", str(summary)]
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            command, env=dict(env), stdout=log, stderr=subprocess.STDOUT, **child_options(lock_fd)
        )
    try:
        yield proc
    finally:  # still running: the demo was interrupted (it stops its daemon on SIGTERM)
        stop_process(proc, grace_seconds=120.0)


def dagster_result(proc: subprocess.Popen, summary: Path, log_path: Path) -> dict[str, Any]:
    code = proc.wait()
    if code != 0 and summary.exists():  # what each sensor and schedule did before it failed
        print("\n".join(automation_lines(json.loads(summary.read_text()))), flush=True)
    if code != 0 or not summary.exists():
        reason = f"Dagster exited with {code} (see {log_path}){disk_full_hint(summary.parent)}"
        step = "run the automation"
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
        raise DemoError(step, reason + disk_full_hint(settings.home))


def check_collected(home: Path, log_path: Path) -> None:
    """A disk that filled up while the collectors ran cost samples: the summary's counts are
    short, so the demo does not end as a success."""
    if "no space left" in log_path.read_text(errors="replace").lower():
        reason = (
            f"the disk of {home} filled up while they ran: samples were lost and the counts "
            f"above are short (see {log_path}); free some space, or set SLUICE_HOME to a "
            "directory on another disk, and run the demo again"
        )
        step = "collect"
        raise DemoError(step, reason)


# --- the whole demo ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.demo", description=__doc__)
    parser.add_argument("--short", action="store_true", help="collect for 15 s (for CI)")
    parser.add_argument("--seconds", type=float, help="how long the collectors run")
    parser.add_argument(
        "--warm-spark",
        action="store_true",
        help="start a warm Spark for the demo's jobs (`sluice spark start`), stop it at the end",
    )
    return parser.parse_args(argv)


def load_demo_settings() -> SluiceSettings:
    settings = load_settings()
    if settings.source is None:
        reason = (
            f"no sluice.toml in {Path.cwd()} (nor SLUICE_CONFIG): run the demo from the Sluice "
            "checkout (make -C /path/to/sluice demo), or set SLUICE_CONFIG to its sluice.toml"
        )
        step = "read sluice.toml"
        raise DemoError(step, reason)
    return settings


def _interrupt(signum: int, frame: object) -> None:
    """The first Ctrl-C or SIGTERM: stop everything (`DemoInterrupted`); later ones wait."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _still_stopping)
    os.write(2, f"\ndemo: {signal.Signals(signum).name}: stopping what it started\n".encode())
    raise DemoInterrupted(signum)


def _still_stopping(signum: int, frame: object) -> None:
    note = f"demo: still stopping (kill -9 {os.getpid()} leaves its processes to stop alone)\n"
    os.write(2, note.encode())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = DemoPlan.from_args(args)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)
    settings = load_demo_settings()
    env = demo_environ(settings, os.environ)
    logs = settings.home / "demo"
    with home_held(settings) as lock_fd, warm_spark(args.warm_spark, env):
        interface = pick_interface()
        extra = " (with 8 MB loopback bursts of 1.5 s every 4 s)" if interface == "lo" else ""
        print(
            f"collecting for {plan.collect_seconds:.0f} s: NIC {interface}{extra} + generator",
            flush=True,
        )
        collector_env = collector_environ(settings, interface, env)
        until = time.time() + plan.collect_seconds
        stopped, summary = logs / "collectors.stopped", logs / "dagster-summary.json"
        dagster_log = logs / "dagster.log"
        with dagster_running(until, stopped, summary, dagster_log, env, lock_fd=lock_fd) as dagster:
            bursts = LoopbackBursts() if interface == "lo" else contextlib.nullcontext()
            with collectors_running(collector_env, logs / "collector.log", lock_fd), bursts:
                wait_for_streams(settings, timeout=30.0)
                print(
                    "collectors are writing; Dagster's sensors catch up (mirror, exports, slices)",
                    flush=True,
                )
                time.sleep(max(0.0, until - time.time()))
            stopped.touch()
            print(
                "collectors stopped; Dagster's automation: last catch-up, replays, a scheduled "
                "revalidation, analytics",
                flush=True,
            )
            result = dagster_result(dagster, summary, dagster_log)
        print_summary(settings, result, plan.collect_seconds)
        check_collected(settings.home, logs / "collector.log")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SluiceError as exc:
        print(f"demo: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except DemoInterrupted as exc:
        print(
            f"demo: stopped by {exc}: its collectors, Dagster and Spark are stopped; "
            "the next demo starts clean",
            file=sys.stderr,
        )
        sys.exit(128 + exc.signum)
