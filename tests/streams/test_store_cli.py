"""`sluice store ...` as a user runs it: a real subprocess, real files, one line per error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert info["events"] == 4 and len(info["segments"]) == 2 and info["tail"].startswith("v1~")
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
    assert "--auto takes" in proc.stderr


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
