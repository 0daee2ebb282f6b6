"""`sluice` at the edges of a shell: a reader that closes early, a full device, Ctrl-C and
SIGTERM, a terminal that is not UTF-8, closed standard descriptors (`pipeline/cli/process.py`).
Every test runs the real command in a subprocess, as an operator's shell would."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SLUICE = [sys.executable, "-m", "pipeline.cli"]


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A fresh home and store, and standard output buffered as an operator's shell has it
    (PYTHONUNBUFFERED, which CI may set, would hide the flush at exit)."""
    base = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "PYTHONIOENCODING")
    }
    return {
        **base,
        "PYTHONPATH": str(ROOT),
        "SLUICE_HOME": str(tmp_path / "home"),
        "SLUICE_STORE": f"embedded:{tmp_path / 'store'}",
    }


def sluice(env: dict[str, str], *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SLUICE, *args], input=stdin, capture_output=True, env=env, check=False, timeout=60
    )


@pytest.fixture
def stream(env) -> str:
    """a/b with a thousand events."""
    assert sluice(env, "store", "create", "a/b").returncode == 0
    lines = b"".join(b"event %d\n" % i for i in range(1000))
    assert sluice(env, "store", "write", "a/b", stdin=lines).returncode == 0
    return "a/b"


def intact(env: dict[str, str]) -> bool:
    return sluice(env, "store", "verify").returncode == 0


def with_reader_gone(env: dict[str, str], *args: str) -> tuple[int, str]:
    """Run `sluice ARGS` with its standard output a pipe whose reader has gone (`| head -0`):
    the exit status and standard error."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        proc = subprocess.run(
            [*SLUICE, *args],
            check=False,
            stdout=writer,
            stderr=subprocess.PIPE,
            env=env,
            timeout=60,
        )
    finally:
        os.close(writer)
    return proc.returncode, proc.stderr.decode()


@pytest.mark.parametrize(
    "args",
    [
        ("store", "read", "a/b"),
        ("store", "info", "a/b"),
        ("store", "list"),
        ("store", "cut", "a/b"),
        ("--help",),
    ],
    ids=" ".join,
)
def test_a_reader_that_closes_early_ends_the_command_quietly_with_141(env, stream, args):
    status, stderr = with_reader_gone(env, *args)
    assert (status, stderr) == (141, "")
    assert intact(env)


def test_a_change_is_kept_whole_when_the_reader_of_its_line_is_gone(env, stream):
    assert with_reader_gone(env, "store", "create", "a/c", "--segments", "3") == (141, "")
    assert sluice(env, "store", "info", "a/c").returncode == 0
    assert intact(env)


@pytest.mark.parametrize(
    "args",
    [("store", "read", "a/b"), ("store", "info", "a/b"), ("--version",)],
    ids=" ".join,
)
def test_a_full_device_on_standard_output_is_one_line_and_exit_1(env, stream, args):
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [*SLUICE, *args], check=False, stdout=full, stderr=subprocess.PIPE, env=env, timeout=60
        )
    expected = "sluice: error: cannot write standard output: No space left on device\n"
    assert (proc.returncode, proc.stderr.decode()) == (1, expected)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_long_read_with_one_line(env, stream, signum, status):
    """`store read --follow` never ends by itself: it is mid-command when the signal comes."""
    proc = subprocess.Popen(
        [*SLUICE, "store", "read", "--follow", "a/b"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout.readline() == b"event 0\n"
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    assert (proc.returncode, stderr.decode()) == (status, f"sluice: interrupted by {name}\n")
    assert intact(env)


def drained(pipe: int) -> bool:
    """Nothing written to `pipe` is left unread."""
    return struct.unpack("i", fcntl.ioctl(pipe, termios.FIONREAD, b"\0\0\0\0"))[0] == 0


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_while_write_waits_for_input_keeps_the_lines_read(env, stream, signum, status):
    """Lines typed, then Ctrl-C instead of Ctrl-D: they are stored, and the count is said."""
    proc = subprocess.Popen(
        [*SLUICE, "store", "write", "a/b"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        proc.stdin.write(b"typed 1\ntyped 2\ntyped 3\n")
        proc.stdin.flush()
        while not drained(proc.stdin.fileno()):
            time.sleep(0.05)
        time.sleep(0.3)  # read, written to the writer's buffer, waiting for the next line
        proc.send_signal(signum)
        proc.wait(timeout=30)  # standard input still open: a terminal's, not at its end
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    expected = f"wrote 3 events to a/b\nsluice: interrupted by {name}\n"
    assert (proc.returncode, stderr.decode()) == (status, expected)
    read = sluice(env, "store", "read", "a/b").stdout.splitlines()
    assert (len(read), read[-3:]) == (1003, [b"typed 1", b"typed 2", b"typed 3"])
    assert intact(env)


def test_a_line_from_a_slow_producer_is_stored_while_the_producer_waits(env, stream):
    """`tail -f log | sluice store write`: a line, then nothing more for a while. The line is
    stored without waiting for more input, and survives `kill -9` of the writer."""
    proc = subprocess.Popen(
        [*SLUICE, "store", "write", "a/b"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    try:
        proc.stdin.write(b"slow 1\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 30
        while sluice(env, "store", "read", "a/b").stdout.splitlines()[-1] != b"slow 1":
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the line was never stored"
            time.sleep(0.1)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.stdin.close()
    read = sluice(env, "store", "read", "a/b").stdout.splitlines()
    assert (len(read), read[-1]) == (1001, b"slow 1")
    assert intact(env)


@pytest.mark.parametrize(
    "locale",
    [
        {"PYTHONIOENCODING": "ascii"},
        {"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"},
    ],
    ids=["ascii", "C locale"],
)
def test_text_a_terminal_cannot_show_is_escaped_not_a_crash(env, stream, locale):
    created = sluice(
        env,
        "slices",
        "create",
        "a/b",
        "--from",
        "2020-01-01T00:00Z",
        "--to",
        "2020-01-02T00:00Z",
        "--sensor",
        "clé",
        "--allow-empty",
    )
    assert created.returncode == 0, created.stderr
    listed = sluice({**env, **locale}, "slices", "list", "a/b")
    assert (listed.returncode, listed.stderr) == (0, b"")
    assert b"cl\\xe9" in listed.stdout


def closed(descriptor: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`sluice ARGS` started by a shell with `descriptor` closed (`<&-`, `>&-`)."""
    shell = f'exec "$@" {descriptor}&-'
    return subprocess.run(
        ["sh", "-c", shell, "sh", *SLUICE, *args],
        capture_output=True,
        env=env,
        check=False,
        timeout=60,
    )


def test_a_closed_standard_input_is_one_line_and_writes_nothing(env, stream):
    proc = closed("<", env, "store", "write", "a/b")
    expected = "sluice: error: standard input is closed: give the command a file or a pipe on it"
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith(expected) and proc.stderr.count(b"\n") == 1
    assert len(sluice(env, "store", "read", "a/b").stdout.splitlines()) == 1000


def test_a_closed_standard_output_is_one_line_not_silence(env, stream):
    proc = closed(">", env, "store", "info", "a/b")
    expected = (
        "sluice: error: cannot write standard output: it was closed when the command started\n"
    )
    assert (proc.returncode, proc.stderr.decode()) == (1, expected)
