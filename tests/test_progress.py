"""Progress of long work: a tqdm bar on a terminal, plain lines elsewhere, nothing with -q,
and never a byte of it on standard output, which scripts parse."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from pipeline import cli
from pipeline.cli.progress import BarTask, LineTask, Progress
from pipeline.jobs.runner import BatchReport

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def filled(store_dir) -> str:
    """A stream of two segments, 300 events in all; its store URI (the store is closed, so
    `sluice store repair` may run on it)."""
    from pipeline.streams import open_store

    uri = f"embedded:{store_dir}"
    with open_store(uri) as store:
        store.create_stream("site/net", segments=2)
        with store.writer("site/net") as writer:
            for i in range(300):
                writer.write(f'{{"n": {i}}}'.encode(), routing_key=f"k{i % 5}")
    return uri


def sluice_env(store_uri: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "SLUICE_STORE": store_uri}


def run_piped(store_uri: str, *args: str) -> subprocess.CompletedProcess:
    """`sluice …` with standard output and standard error both pipes (a script, a log)."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args],
        capture_output=True,
        text=True,
        env=sluice_env(store_uri),
        check=False,
        timeout=60,
    )


def run_on_terminal(store_uri: str, *args: str, timeout: float = 60) -> tuple[int, str, str]:
    """`sluice …` with standard error on a real pseudo-terminal (80 columns) and standard
    output a pipe: (exit code, what the terminal got, standard output)."""
    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=terminal_fd,
        env={**sluice_env(store_uri), "TERM": "xterm"},
    )
    os.close(terminal_fd)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main_fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal's last writer has gone: EIO
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(main_fd)
    out = proc.stdout.read().decode() if proc.stdout else ""
    return proc.wait(timeout=10), seen.decode(errors="replace"), out


# --- the store's scans ----------------------------------------------------------------------


def test_verify_through_a_pipe_shows_plain_lines_and_keeps_stdout_as_it_was(filled):
    done = run_piped(filled, "store", "verify")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("intact: 1 stream, 2 segments")
    assert done.stdout.count("\n") == 1
    lines = done.stderr.splitlines()
    assert lines, "no progress on standard error"
    assert all(line.startswith("verify: ") and line.endswith("%)") for line in lines), lines
    assert lines[-1].endswith(" bytes (100%)")
    assert "\r" not in done.stderr and "\x1b" not in done.stderr


def test_verify_on_a_terminal_draws_a_tqdm_bar_on_stderr_only(filled):
    code, terminal, out = run_on_terminal(filled, "store", "verify")
    assert code == 0, terminal
    assert out.startswith("intact: 1 stream, 2 segments") and out.count("\n") == 1
    assert "\r" in terminal  # redrawn in place
    assert "verify: 100%|" in terminal and "█" in terminal  # tqdm's bar, full
    assert "of " not in terminal  # not the plain lines


def test_quiet_silences_progress_and_verbose_adds_the_time(filled):
    quiet = run_piped(filled, "-q", "store", "repair")
    assert quiet.returncode == 0 and quiet.stderr == ""
    assert quiet.stdout == "repaired: 0 fixed, nothing left\n"
    verbose = run_piped(filled, "-v", "store", "verify")
    assert verbose.returncode == 0
    progress = [line for line in verbose.stderr.splitlines() if line.startswith("verify: ")]
    assert progress and all(line.endswith(" s]") for line in progress), verbose.stderr


def test_quiet_on_a_terminal_draws_no_bar(filled):
    code, terminal, out = run_on_terminal(filled, "-q", "store", "verify")
    assert code == 0 and terminal == "" and out.startswith("intact: ")


def test_a_large_read_shows_progress_and_a_small_one_does_not(filled, monkeypatch, capsys):
    argv = ["--store", filled, "store", "read", "site/net"]
    assert cli.main(argv) == 0
    small = capsys.readouterr()
    assert small.err == "" and len(small.out.splitlines()) == 300
    monkeypatch.setattr("pipeline.cli.store.LARGE_READ_BYTES", 1)
    assert cli.main(argv) == 0
    large = capsys.readouterr()
    assert large.out == small.out  # the data, exactly as before
    lines = large.err.splitlines()
    assert lines[0].startswith("read site/net: ")
    assert lines[-1].endswith("(100%)") and 3 <= len(lines) <= 11, lines


# --- the pieces -----------------------------------------------------------------------------


def test_plain_lines_come_once_per_tenth(capsys):
    task = LineTask("scan", "byte", verbose=False)
    task.stage("opening")
    for done in range(0, 1001, 7):
        task.count(done, 1000)
    task.count(1000, 1000)
    task.status("never on plain lines")
    task.note("a batch")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "scan: opening"
    assert lines[1] == "scan: 0 of 1,000 bytes (0%)"
    assert len(lines) == 1 + 11 + 1 and lines[-2] == "scan: 1,000 of 1,000 bytes (100%)"
    assert lines[-1] == "a batch"


def test_one_byte_and_one_event_are_singular(capsys):
    LineTask("read", "byte", verbose=False).count(1, 1)
    assert capsys.readouterr().err == "read: 1 of 1 byte (100%)\n"
    report = BatchReport("mirror", 0, None, "v1~a", 1, 1, 0, 0, 5)
    assert "mirror batch 0: 1 event, 1 row, 0 quarantined" in report.line()
    two = BatchReport("mirror", 1, "v1~a", "v1~b", 2, 2, 0, 0, 5)
    assert "2 events, 2 rows" in two.line()


def test_verbose_on_a_terminal_keeps_stages_and_notes_above_the_bar(monkeypatch):
    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with os.fdopen(terminal_fd, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        for verbose in (True, False):
            task = BarTask("job", "event", verbose)
            task.stage(f"stage {verbose}")
            task.note(f"note {verbose}")
            task.status("3 events so far")
            task.close()
        terminal.flush()
        seen = b""
        while select.select([main_fd], [], [], 0.2)[0]:
            seen += os.read(main_fd, 65536)
    os.close(main_fd)
    text = seen.decode()
    assert "job: stage True\r\n" in text and "note True\r\n" in text  # lines that stay
    assert "job: stage False" in text and "note False" not in text  # on the bar only
    assert re.search(r"\rjob: 3 events so far \[\d\d:\d\d\]", text)


def test_the_style_follows_quiet_verbose_and_the_terminals(monkeypatch):
    from argparse import Namespace

    assert Progress.of(Namespace(quiet=True, verbose=0)).style == "off"
    assert Progress.of(Namespace(quiet=False, verbose=0)) == Progress("lines")
    assert Progress.of(Namespace(quiet=False, verbose=1)) == Progress("lines", verbose=True)

    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Terminal())
    assert Progress.of(Namespace(quiet=False, verbose=0)).style == "bar"
    monkeypatch.setattr(sys, "stdout", Terminal())
    # the command's own data on the same terminal would tear a bar: plain lines instead
    assert Progress.of(Namespace(quiet=False, verbose=0), data_on_stdout=True).style == "lines"
    assert Progress.of(Namespace(quiet=False, verbose=0)).style == "bar"


# --- Spark: sluice run and sluice replay ----------------------------------------------------


@pytest.mark.spark
def test_run_shows_spark_starting_where_it_reads_and_each_batch(spark, filled, capsys):
    argv = ["--store", filled, "run", "mirror", "--stream", "site/net", "--to", "site/copy"]
    assert cli.main([*argv, "--max-events", "100"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # stdout: the summary, nothing else
    assert summary["events"] == 300
    lines = captured.err.splitlines()
    assert lines[0].startswith("mirror: reading site/net from head")
    assert lines[1] == "mirror: starting Spark"  # only once it has something to do
    batches = [line for line in lines if line.startswith("mirror batch ")]
    assert len(batches) == summary["batches"] >= 3
    assert "100 events, 100 rows" in batches[0]

    argv = ["--store", filled, "-q", "run", "mirror", "--stream", "site/net", "--to", "site/c2"]
    assert cli.main(argv) == 0
    quiet = capsys.readouterr()
    assert json.loads(quiet.out)["events"] == 300
    assert quiet.err == ""


@pytest.mark.spark
def test_replay_shows_its_steps_on_stderr(spark, store, store_dir, monkeypatch, capsys):
    from pipeline.jobs.slices import record_slices, time_window_slice
    from tests.jobs.test_replay_support import STREAM, T0, nic_stream

    monkeypatch.setenv("SLUICE_CONFIG", "/dev/null")
    second = 1_000_000_000
    nic_stream(store, {"edge1": [[100] * 10, [20_000] * 10, [100] * 10]})
    record = time_window_slice(store, STREAM, T0, T0 + 3 * second, sensor="edge1")
    record_slices(store, [record])
    argv = ["--store", f"embedded:{store_dir}", "replay", record.slice_id]
    argv += ["--schema", "NetworkSamples"]
    assert cli.main([*argv, "--model", "pipeline.models.nic:throughput"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert captured.out.count("\n") == 1  # one JSON line, as before
    rows = summary["input_rows"]
    assert captured.err.splitlines() == [
        f"replay: finding slice {record.slice_id}",
        "replay: starting Spark",
        f"replay: reading the slice ({record.cuts[0].bytes_until(record.cuts[1]):,} bytes "
        "between its cuts)",
        f"replay: running pipeline.models.nic:throughput on {rows} rows",
        f"replay: writing {summary['output_rows']} result rows",
    ]
    compare = ["--store", f"embedded:{store_dir}", "replay", "compare", record.slice_id]
    compare += ["--schema", "NetworkSamples", "--json", "--model", "pipeline.models.nic:throughput"]
    assert cli.main([*compare, "--model", "pipeline.models.nic:throughput,burst_mbps=1"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["slice_id"] == record.slice_id
    stages = [line.split(": ", 2)[1] for line in captured.err.splitlines()]
    assert stages[:2] == [f"finding slice {record.slice_id}", "starting Spark"]
    assert stages[2:] == ["a", "a", "a", "b", "b", "b", "comparing the results"]
    assert all(line.startswith("replay compare: ") for line in captured.err.splitlines())
