"""benchmarks/results.py: each script's section of RESULTS.md, the machine it ran on, and the
warning a run on a busy machine carries (issue 15). Real calls: /proc, sysfs, df, git, java."""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.results import (
    HEADER,
    ROOT,
    Disk,
    Figure,
    Load,
    Machine,
    Recorder,
    load_warning,
    replace_section,
)

FIGURES = [
    Figure("durable append, 1 writer", "MB/s", 700.0, 1400.0, "plain file", ">= 0.80"),
    Figure("verify", "MB/s", 12_500.0),
]


def recorder(script: str, before: Load) -> Recorder:
    rec = Recorder(f"benchmarks/{script}.py", f"{script}: the title line.\n\nMore text.")
    rec.load_before = before
    return rec


IDLE = Load(0.0, 0.0, 0.0)


def test_sections_are_added_then_replaced_in_place(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    recorder("store", IDLE).write(FIGURES, ["note one"], path=path)
    recorder("mirror", IDLE).write([Figure("mirror", "events/s", 1.0, 2.0, "raw copy")], path=path)
    first = path.read_text()
    assert first.startswith(HEADER)
    assert first.index("results:store begin") < first.index("results:mirror begin")

    recorder("store", IDLE).write([Figure("verify", "MB/s", 99.5)], path=path)
    text = path.read_text()
    assert text.count("<!-- results:store begin -->") == 1
    assert text.count("<!-- results:store end -->") == 1
    assert "99.5 MB/s" in text and "note one" not in text and "700" not in text
    assert text.index("results:store begin") < text.index("results:mirror begin")
    mirror = first[first.index("<!-- results:mirror begin") :]
    assert text.endswith(mirror)  # the other script's section is untouched


def test_replace_section_leaves_text_around_the_markers() -> None:
    text = "# Title\n\nintro\n\n<!-- results:a begin -->\nold\n<!-- results:a end -->\n\ntail\n"
    new = replace_section(text, "a", "new $1 \\1 body")  # no regex escapes interpreted
    assert new == text.replace("old", "new $1 \\1 body")
    assert replace_section(new, "a", "new $1 \\1 body") == new


def test_a_section_has_the_command_figures_and_ratios(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = recorder("store", IDLE).write(FIGURES, ["CRC-32 from zlib-ng"], path=tmp_path / "R.md")
    text = path.read_text()
    assert "## `store.py`: store: the title line." in text
    row = "| durable append, 1 writer | 700.0 MB/s | plain file: 1,400 MB/s | 0.50 | >= 0.80 |"
    assert row in text
    assert "| verify | 12,500 MB/s |  |  |  |" in text
    assert "- CRC-32 from zlib-ng" in text
    rec = recorder("store", IDLE)
    if "PYTHONPATH" in os.environ:  # which code ran is part of the command
        assert rec.command.startswith(shlex.join([f"PYTHONPATH={os.environ['PYTHONPATH']}"]))
    monkeypatch.setenv("SLUICE_TEST_SECRET", "x")  # other variables may hold secrets
    assert "SLUICE_TEST_SECRET" not in recorder("store", IDLE).command
    assert f"\n    {rec.command}\n" in rec.section(FIGURES, [], Machine.here(tmp_path), IDLE)
    assert shlex.split(rec.command)[-len(sys.argv) :] == [
        str(Path(sys.argv[0]).resolve().relative_to(ROOT))
        if Path(sys.argv[0]).resolve().is_relative_to(ROOT)
        else str(Path(sys.argv[0]).resolve()),
        *sys.argv[1:],
    ]


def test_the_machine_block_describes_this_machine(tmp_path: Path) -> None:
    machine = Machine.here(tmp_path)
    assert machine.cores == os.cpu_count()
    meminfo = Path("/proc/meminfo").read_text().split("\n")[0]
    assert machine.memory_gib == pytest.approx(int(meminfo.split()[1]) / 2**20)
    df = shutil.which("df")
    if df:
        out = subprocess.run(
            [df, "--output=source,fstype", str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")[1]
        source, fstype = out.split()
        assert machine.disk.device == source
        assert machine.disk.filesystem.startswith(f"{fstype} on ")
    dev = os.stat(tmp_path).st_dev
    if Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").exists():
        assert machine.disk.rotational in (True, False)
    versions = machine.versions
    assert versions["python"] == platform.python_version()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert versions["sluice"].split("(git ")[1].startswith(head)
    for name in ("java", "pyspark", "duckdb", "pyarrow", "pandas", "sqlite"):
        assert versions[name]

    text = recorder("store", Load.now()).write(FIGURES, path=tmp_path / "R.md").read_text()
    assert f"Machine: {machine.cores} cores" in text
    assert f"on {machine.disk}" in text
    assert f"python {platform.python_version()}" in text
    assert "before the run" in text and "after it" in text


def test_load_average_is_the_kernels() -> None:
    now, kernel = Load.now(), os.getloadavg()
    assert now.one == pytest.approx(kernel[0], abs=2.0)
    assert str(Load(1.234, 0.5, 0.0)) == "1.23 / 0.50 / 0.00"
    assert isinstance(Disk.of(Path.cwd()).device, str)


def test_a_run_on_a_loaded_machine_says_so(tmp_path: Path) -> None:
    cores = os.cpu_count() or 1
    assert load_warning(IDLE, IDLE, cores) is None
    assert load_warning(Load(0.49 * cores, 0, 0), Load(1.4 * cores, 0, 0), cores) is None

    busy = Load(2.0 * cores, 1.0, 1.0)
    warning = load_warning(busy, IDLE, cores)
    assert warning is not None
    assert f"Measured under load (1-min load average {2.0 * cores:.2f} on {cores} cores)" in (
        warning
    )
    after_only = load_warning(IDLE, Load(1.6 * cores, 0, 0), cores)
    assert after_only is not None and f"{1.6 * cores:.2f} on {cores} cores" in after_only

    text = recorder("store", busy).write(FIGURES, path=tmp_path / "R.md").read_text()
    section = text[text.index("<!-- results:store begin") :]
    assert "> **Measured under load (1-min load average" in section
    assert section.index("Measured under load") < section.index("| measurement |")


def test_a_variant_is_a_section_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    recorder("collectors", IDLE).write([Figure("jitter p99", "ms", 0.12)], path=path)
    loaded = Recorder("benchmarks/collectors.py", "collectors: title", variant="load")
    loaded.load_before = IDLE
    loaded.write([Figure("jitter p99", "ms", 0.9)], ["2 spinners"], path=path)
    text = path.read_text()
    assert text.count("<!-- results:collectors begin -->") == 1
    assert text.count("<!-- results:collectors-load begin -->") == 1
    assert "## `collectors.py, load`" in text and "0.12 ms" in text and "0.9 ms" in text
