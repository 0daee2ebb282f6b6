"""`sluice store ...` as a user runs it: a real subprocess, real files, one line per error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.streams import InvalidArgument, open_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sluice(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLUICE_STORE": f"embedded:{tmp_path / 's'}"}

    def run(*args: str, stdin: str = "", ok: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )
        assert (proc.returncode == 0) == ok, proc.stderr
        return proc

    return run


def test_round_trip(sluice):
    sluice("store", "create", "site/net", "--segments", "2")
    sluice("store", "write", "site/net", "--routing-key", "eth0", stdin="a\nb\nc\n")
    assert sluice("store", "read", "site/net").stdout == "a\nb\nc\n"
    cut = sluice("store", "cut", "site/net").stdout.strip()
    sluice("store", "write", "site/net", "-k", "eth0", stdin="d\n")
    assert sluice("store", "read", "site/net", "--from", cut).stdout == "d\n"
    assert sluice("store", "read", "site/net", "--to", cut).stdout == "a\nb\nc\n"
    info = json.loads(sluice("store", "info", "site/net").stdout)
    assert info["events"] == 4 and len(info["segments"]) == 2 and info["tail"].startswith("v2~")
    assert sluice("store", "list").stdout.split() == ["site/net"]
    sluice("store", "truncate", "site/net", cut)
    assert sluice("store", "read", "site/net").stdout == "d\n"


def test_scale(sluice):
    sluice("store", "create", "site/hot")
    sluice("store", "write", "site/hot", "-k", "a", stdin="1\n2\n")
    assert "created segments [1, 2]" in sluice("store", "scale", "site/hot", "--split", "0").stdout
    sluice("store", "write", "site/hot", "-k", "a", stdin="3\n")
    assert sluice("store", "read", "site/hot").stdout == "1\n2\n3\n"
    assert "active segments [3]" in sluice("store", "scale", "site/hot", "--merge", "1,2").stdout
    proc = sluice("store", "scale", "site/hot", "--auto", "bogus", ok=False)
    assert f"argument --auto: 'bogus': {AUTO_RULE}" in proc.stderr


AUTO_RULE = "give events_per_second:N or kbytes_per_second:N, N a rate above 0 per second"


def refused(proc: subprocess.CompletedProcess, line: str, exit_code: int) -> None:
    """`proc` failed with `exit_code` and its error is `line`, the last (argparse prints its
    usage first) and no traceback."""
    assert proc.returncode == exit_code, proc.stderr
    assert proc.stderr.splitlines()[-1] == line
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--auto", "events_per_second:abc"),
            f"argument --auto: 'events_per_second:abc': {AUTO_RULE}",
        ),
        (
            ("--auto", "events_per_second:-1"),
            f"argument --auto: 'events_per_second:-1': {AUTO_RULE}",
        ),
        (("--auto", "kbytes_per_second:0"), f"argument --auto: 'kbytes_per_second:0': {AUTO_RULE}"),
        (("--split", "1", "--parts", "0"), "argument --parts: 0: a split makes 2 or more segments"),
        (
            ("--split", "1", "--parts", "-1"),
            "argument --parts: -1: a split makes 2 or more segments",
        ),
        (
            ("--auto", "events_per_second:10", "--window", "0"),
            "argument --window: 0: a number of seconds above 0",
        ),
        (
            ("--merge", "a,b"),
            "argument --merge: 'a,b' is not a list of segment numbers such as 1,2",
        ),
        (
            ("--merge", "1"),
            "argument --merge: '1': a merge takes 2 or more neighbouring segments, such as 1,2",
        ),
    ],
)
def test_scale_refuses_a_bad_option_in_one_line_and_changes_nothing(sluice, args, line):
    sluice("store", "create", "site/net", "--segments", "2")
    sluice("store", "write", "site/net", "-k", "eth0", stdin="a\nb\n")
    before = sluice("store", "info", "site/net").stdout
    proc = sluice("store", "scale", "site/net", *args, ok=False)
    refused(proc, f"sluice store scale: error: {line}", exit_code=2)
    assert sluice("store", "info", "site/net").stdout == before


def test_scale_of_a_segment_that_is_not_active_names_the_active_ones(sluice):
    sluice("store", "create", "site/net", "--segments", "2")
    sluice("store", "scale", "site/net", "--split", "1")  # seals 1, makes 2 and 3
    before = sluice("store", "info", "site/net").stdout
    active = "its active segments are 0, 2, 3 (`sluice store info site/net` lists them)"
    for args, segment in ((("--split", "99"), 99), (("--split", "1"), 1), (("--merge", "0,1"), 1)):
        proc = sluice("store", "scale", "site/net", *args, ok=False)
        line = f"sluice: error: stream site/net has no active segment {segment}: {active}"
        refused(proc, line, exit_code=1)
        assert proc.stderr.count("\n") == 1
    assert sluice("store", "info", "site/net").stdout == before


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--retention-bytes", "-5"),
            "argument --retention-bytes: -5: keep a positive whole number of bytes",
        ),
        (
            ("--retention-bytes", "0"),
            "argument --retention-bytes: 0: keep a positive whole number of bytes",
        ),
        (
            ("--retention-seconds", "-1"),
            "argument --retention-seconds: -1: keep events for a positive number of seconds",
        ),
        (
            ("--retention-seconds", "0"),
            "argument --retention-seconds: 0: keep events for a positive number of seconds",
        ),
    ],
)
def test_create_refuses_a_retention_that_would_keep_nothing(sluice, args, line):
    sluice("store", "create", "site/net")
    proc = sluice("store", "create", "site/n1", *args, ok=False)
    refused(proc, f"sluice store create: error: {line}", exit_code=2)
    assert sluice("store", "list").stdout == "site/net\n"


def test_create_refuses_more_segments_than_a_stream_can_have(sluice, tmp_path):
    proc = sluice("store", "create", "site/many", "--segments", "2000", ok=False)
    line = "sluice: error: invalid number of segments 2000: a stream has 1 to 1024 segments"
    refused(proc, line, exit_code=1)
    assert sluice("store", "list").stdout == ""
    with open_store(f"embedded:{tmp_path / 's'}") as store, pytest.raises(InvalidArgument):
        store.create_stream("site/many", segments=True)  # a bool is no number of segments


def test_a_cut_of_another_stream_is_quoted_as_the_cut(sluice):
    sluice("store", "create", "site/net")
    sluice("store", "write", "site/net", stdin="a\n")
    before = sluice("store", "info", "site/net").stdout
    for action in (("read", "site/net", "--from"), ("truncate", "site/net")):
        proc = sluice("store", *action, "v1~site~other~0-0", ok=False)
        line = (
            "sluice: error: invalid stream cut 'v1~site~other~0-0': it is a cut of stream"
            " site/other, not of site/net"
        )
        refused(proc, line, exit_code=1)
        assert proc.stderr.count("\n") == 1
    assert sluice("store", "info", "site/net").stdout == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("store", "info", "site/missing"), "stream site/missing does not exist"),
        (("store", "create", "../etc/passwd"), "invalid stream name"),
        (("store", "read", "site/net", "--from", "v1~x"), "invalid stream cut"),
        (("store", "read", "site/net", "--from", "v1~other~s~0-0"), "is a cut of stream other/s"),
    ],
)
def test_errors_are_one_clear_line(sluice, args, message):
    sluice("store", "create", "site/net")
    proc = sluice(*args, ok=False)
    assert message in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "action",
    [
        ("store", "info", "a/b"),
        ("store", "read", "a/b"),
        ("store", "cut", "a/b"),
        ("store", "verify"),
        ("store", "repair"),
        ("store", "write", "a/b"),
        ("store", "truncate", "a/b", "tail"),
        ("store", "retain"),
        ("store", "scale", "a/b", "--split", "0"),
        ("store", "seal", "a/b"),
        ("store", "delete", "a/b"),
        ("slices", "create", "a/b", "--from", "2026-01-01T00:00Z", "--to", "2026-01-02T00:00Z"),
        ("replay", "s1", "--model", "pipeline.models.nic:throughput"),
    ],
)
def test_a_store_that_does_not_exist_is_never_created_but_by_create(sluice, tmp_path, action):
    """A misspelt --store used to be opened as a new store: a directory with a catalog was
    left behind, and the command went on as if the store were empty (`repair` even said
    "repaired"). Only `store create` makes a store."""
    typo = tmp_path / "typo"
    proc = sluice("--store", f"embedded:{typo}", *action, stdin="x\n", ok=False)
    assert f"no store at {typo}: nothing was ever written there" in proc.stderr
    assert proc.stderr.count("\n") == 1
    listed = sluice("--store", f"embedded:{typo}", "store", "list")
    assert (listed.stdout, listed.stderr.count("\n")) == ("", 1)
    slices = sluice("--store", f"embedded:{typo}", "slices", "list", "a/b", ok=False)
    assert "no store at" in slices.stderr
    assert not typo.exists()


def test_edge_install_runs_store_and_collect_without_platform_packages(tmp_path):
    """With pyspark, duckdb and dagster unimportable, `sluice store` and `sluice collect` still
    start, and a platform command names the install it needs in one line."""
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    for name in ("pyspark", "duckdb", "dagster", "pandas", "matplotlib"):
        (blocker / f"{name}.py").write_text(f"raise ModuleNotFoundError(name={name!r})\n")
    env = {
        **os.environ,
        "PYTHONPATH": f"{blocker}{os.pathsep}{ROOT}",
        "SLUICE_STORE": f"embedded:{tmp_path / 's'}",
    }

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "pipeline.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=60,
        )

    assert run("store", "create", "edge/net").returncode == 0
    assert run("collect", "--help").returncode == 0
    sql = run("sql", "SELECT 1")
    assert sql.returncode == 1
    assert "needs the platform install" in sql.stderr and sql.stderr.count("\n") == 1
    assert "sql" in run("--help").stdout


def test_retain_applies_each_recorded_policy_and_says_what_it_dropped(sluice):
    sluice("store", "create", "site/kept", "--segments", "2", "--retention-bytes", "13000")
    sluice("store", "create", "site/free")
    for key in ("a", "b", "c", "d"):
        lines = "".join(f"{key}{i:04}\n" for i in range(300))
        sluice("store", "write", "site/kept", "-k", key, stdin=lines)
    sluice("store", "write", "site/free", stdin="x\n")
    before = json.loads(sluice("store", "info", "site/kept").stdout)
    out = sluice("store", "retain").stdout
    after = json.loads(sluice("store", "info", "site/kept").stdout)
    dropped = before["bytes"] - after["bytes"]
    moved = [
        a["segment"] for a, b in zip(after["segments"], before["segments"], strict=True) if a != b
    ]
    assert len(moved) == 1, "four blocks of 4,250 bytes: the oldest is dropped"
    assert out == (
        f"site/kept: dropped {dropped:,} bytes from segment {moved[0]} (at most 13,000 bytes); "
        f"1,200 events before, {after['events']:,} now; head is now {after['head']}\n"
    ), "a stream without a policy is left out"
    assert after["events"] == 900
    assert sluice("store", "retain", "site/kept", "site/free").stdout == (
        "site/kept: within its policy (at most 13,000 bytes), nothing dropped\n"
        "site/free: no retention policy, kept everything\n"
    )
    assert sluice("store", "read", "site/free").stdout == "x\n"
    proc = sluice("store", "retain", "site/missing", ok=False)
    assert "stream site/missing does not exist" in proc.stderr


def test_retain_without_a_policy_anywhere_says_so(sluice):
    sluice("store", "create", "site/net")
    assert sluice("store", "retain").stdout == (
        "no stream has a retention policy (`sluice store create --retention-…`)\n"
    )


def test_retain_on_pravega_leaves_it_to_the_controller(sluice):
    """No cluster runs here, and none is needed: the command knows from the URI."""
    out = sluice("--store", "pravega://127.0.0.1:1", "store", "retain", "site/net").stdout
    assert out.startswith("nothing to do: the Pravega controller of pravega://127.0.0.1:1")
