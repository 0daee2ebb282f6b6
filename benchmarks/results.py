"""benchmarks/RESULTS.md: each script's side-by-side figures, with the command and the machine.

A script run with `--write-results` hands its figures (`Figure`: Sluice's value, the peer's,
their ratio and the goal) to the `Recorder` it started before measuring; the recorder rewrites
that script's section of RESULTS.md, between `<!-- results:<script> begin/end -->` markers,
so scripts update the file independently and a re-run replaces its own section. Each section
says when and how it was measured: the exact command, the date, the machine (cores, memory,
the work directory's disk and filesystem, the load average before and after the run) and the
versions of Sluice (git commit), Python, Java, Spark, DuckDB and the peers' libraries. A run
that started on a busy machine is marked "measured under load": its ratios are still side by
side in one run, but the absolute figures are lower and noisier than on an idle machine.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.metadata
import os
import platform
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipeline.durable import write_text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
#: A run is marked "measured under load" when, before it started, the 1-minute load average
#: was at least this much per core (other work was running), or afterwards at least
#: `LOADED_AFTER_PER_CORE` per core (the run's own processes count there too).
LOADED_PER_CORE = 0.5
LOADED_AFTER_PER_CORE = 1.5
#: Environment variables that change which code, Java or scratch disk a benchmark uses.
SHOWN_ENVIRONMENT = ("PYTHONPATH", "JAVA_HOME", "SLUICE_BENCH_DIR", "SLUICE_SPARK_MASTER")
LIBRARIES = ("pyspark", "duckdb", "pyarrow", "pandas", "numpy", "msgspec", "zlib-ng")
HEADER = """# Benchmark results

Written by the scripts in `benchmarks/` when run with `--write-results` (`make bench` runs them
all so): one section per script and variant (`collectors.py --load`), replaced when that
script runs again. Every figure is measured side by side with its peer in the same run; the
ratio (Sluice's figure over the peer's: above 1 for a rate, below 1 for a time or a latency,
means Sluice is ahead) is the comparison that holds across machines, the absolute figures
hold for the machine described under each section. What each script measures, and against
what: [README.md](README.md).

A section measured while other work was running (1-minute load average before the run at
least 0.5 per core, or at least 1.5 per core after it) says so at its top.
"""


@dataclass(frozen=True, slots=True)
class Figure:
    """One side-by-side figure: Sluice's value beside its peer's in the same unit (a rate, a
    latency), and their ratio, always Sluice's value over the peer's: above 1 for a rate, or
    below 1 for a latency, means Sluice is ahead."""

    what: str
    unit: str
    sluice: float
    peer: float | None = None
    peer_name: str = ""
    goal: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.peer else self.sluice / self.peer


@dataclass(frozen=True, slots=True)
class Load:
    one: float
    five: float
    fifteen: float

    @classmethod
    def now(cls) -> Load:
        return cls(*os.getloadavg())

    def __str__(self) -> str:
        return f"{self.one:.2f} / {self.five:.2f} / {self.fifteen:.2f}"


@dataclass(frozen=True, slots=True)
class Disk:
    """The block device and filesystem that hold a directory, as the kernel reports them."""

    device: str
    filesystem: str
    rotational: bool | None

    @classmethod
    def of(cls, path: Path) -> Disk:
        mount, source, fstype = _mount_of(path)
        dev = os.stat(path).st_dev
        sysfs = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        rotational = None
        if sysfs.exists():
            block = sysfs.resolve()
            if (block / "partition").exists():
                block = block.parent
            flag = block / "queue" / "rotational"
            rotational = flag.read_text().strip() == "1" if flag.exists() else None
        return cls(device=source, filesystem=f"{fstype} on {mount}", rotational=rotational)

    def __str__(self) -> str:
        spin = {True: "yes", False: "no", None: "unknown"}[self.rotational]
        return f"{self.device} ({self.filesystem}; rotational per the kernel: {spin})"


def _mount_of(path: Path) -> tuple[str, str, str]:
    """(mount point, source, filesystem type) of the mount holding `path`."""
    target, best = str(path.resolve()), ("/", "unknown", "unknown")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        mount = left.split()[4].replace("\\040", " ")
        fstype, source = right.split()[:2]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[0]):
            best = (mount, source, fstype)
    return best


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str
    cores: int
    memory_gib: float
    disk: Disk
    versions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def here(cls, workdir: Path) -> Machine:
        return cls(
            cpu=_cpu_model(),
            cores=os.cpu_count() or 1,
            memory_gib=_memory_kib() / 2**20,
            disk=Disk.of(workdir),
            versions=versions(),
        )


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def _memory_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    return 0


def versions() -> dict[str, str]:
    """Sluice (and its git commit), Python, Java, and the libraries the peers run on."""
    found = {"sluice": f"{_version('sluice')} (git {git_commit()})"}
    found["python"] = platform.python_version()
    found["java"] = java_version()
    found.update({name: _version(name) for name in LIBRARIES})
    found["sqlite"] = sqlite3.sqlite_version
    return found


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git_commit() -> str:
    """The checkout's commit, `+ uncommitted changes` when the working tree differs."""
    try:
        head = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git(
            "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/RESULTS.md"
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head} + uncommitted changes" if dirty else head


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()


def java_version() -> str:
    """The version of the `java` Spark would start ($JAVA_HOME first), or "not found"."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else "java"
    try:
        done = subprocess.run(
            [java, "-version"], check=False, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    match = re.search(r'version "([^"]+)"', done.stderr)
    return match.group(1) if match else "unknown"


class Recorder:
    """Started before a script measures anything (the load average before the run); `write`
    puts its figures into RESULTS.md."""

    def __init__(
        self,
        script: str,
        title: str | None,
        workdir: Path | None = None,
        variant: str | None = None,
    ) -> None:
        """`variant` names a second section of one script (`collectors.py --load 2`: "load"),
        kept beside its plain one instead of replacing it."""
        self.script = Path(script).stem
        self.variant = variant
        self.name = f"{self.script}-{variant}" if variant else self.script
        self.title = (title or self.name).strip().splitlines()[0]
        self.command = command_line()
        self.workdir = workdir or Path(os.environ.get("SLUICE_BENCH_DIR") or tempfile.gettempdir())
        self.started = datetime.now(UTC)
        self.load_before = Load.now()

    @staticmethod
    def add_option(parser: argparse.ArgumentParser) -> None:
        """`--write-results`: the script hands its figures to `write` when it is given."""
        parser.add_argument(
            "--write-results",
            action="store_true",
            help=f"also write this run's figures into {RESULTS.relative_to(ROOT)}",
        )

    def write(
        self, figures: Sequence[Figure], notes: Sequence[str] = (), path: Path = RESULTS
    ) -> Path:
        """Replace this script's section of `path` (created with its header if missing)."""
        section = self.section(figures, notes, Machine.here(self.workdir), Load.now())
        with _locked(path.parent):
            text = path.read_text() if path.exists() else HEADER
            write_text(path, replace_section(text, self.name, section))
        return path

    def section(
        self, figures: Sequence[Figure], notes: Sequence[str], machine: Machine, after: Load
    ) -> str:
        shown = f"{self.script}.py" + (f", {self.variant}" if self.variant else "")
        lines = [f"## `{shown}`: {self.title}", ""]
        warning = load_warning(self.load_before, after, machine.cores)
        if warning:
            lines += [f"> **{warning}**", ""]
        lines += [
            f"    {self.command}",
            "",
            f"Measured {self.started:%Y-%m-%d %H:%M} UTC.",
            "",
            *figure_table(figures),
            "",
        ]
        lines += [f"- {note}" for note in notes]
        lines += [""] if notes else []
        lines += [
            f"Machine: {machine.cores} cores ({machine.cpu}), {machine.memory_gib:.1f} GiB"
            f" memory; work directory {self.workdir} on {machine.disk}; 1/5/15-minute load"
            f" average {self.load_before} before the run, {after} after it.",
            "",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in machine.versions.items()) + ".",
        ]
        return "\n".join(lines)


def command_line() -> str:
    """The command as typed from the repository root: the environment that changes what runs
    (`SHOWN_ENVIRONMENT`; never the rest, which may hold secrets), interpreter, script,
    arguments."""
    python = Path(sys.executable)
    if python.is_relative_to(ROOT):
        python = python.relative_to(ROOT)
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    env = [f"{k}={os.environ[k]}" for k in SHOWN_ENVIRONMENT if k in os.environ]
    return shlex.join([*env, str(python), str(shown), *sys.argv[1:]])


def load_warning(before: Load, after: Load, cores: int) -> str | None:
    """The warning a run on a busy machine carries, or None."""
    if before.one < LOADED_PER_CORE * cores and after.one < LOADED_AFTER_PER_CORE * cores:
        return None
    worst = max(before.one, after.one)
    return (
        f"Measured under load (1-min load average {worst:.2f} on {cores} cores): other work"
        " shared the machine (in a `make bench`, at least the script just before, whose load"
        " is still decaying), so the figures may be lower and noisier than on an idle one."
    )


def figure_table(figures: Sequence[Figure]) -> list[str]:
    rows = ["| measurement | Sluice | peer | Sluice / peer | goal |", "|---|---:|---|---:|---|"]
    for f in figures:
        peer = "" if f.peer is None else f"{f.peer_name}: {_number(f.peer)} {f.unit}".strip()
        ratio = "" if f.ratio is None else f"{f.ratio:.2f}"
        rows.append(f"| {f.what} | {_number(f.sluice)} {f.unit} | {peer} | {ratio} | {f.goal} |")
    return rows


def _number(value: float) -> str:
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def replace_section(text: str, name: str, section: str) -> str:
    """`text` with the section between `name`'s markers replaced (appended if absent)."""
    begin, end = f"<!-- results:{name} begin -->", f"<!-- results:{name} end -->"
    block = f"{begin}\n{section.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text, count=1)
    return text.rstrip("\n") + "\n\n" + block + "\n"


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on a directory: two scripts finishing at once do not lose a section."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
