"""`sluice store ...` as a user runs it: a real subprocess, real files, one line per error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.streams import InvalidArgument, open_store
from tests.permissions import without_dac_override

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
    """Refused by the parser as every other bad option is (exit 2), and the help says so."""
    proc = sluice("store", "create", "site/many", "--segments", "2000", ok=False)
    line = "sluice store create: error: argument --segments: 2000: a stream has 1 to 1024 segments"
    refused(proc, line, exit_code=2)
    assert sluice("store", "list").stdout == ""
    assert "--segments SEGMENTS   1 to 1024 (default 1)" in sluice("store", "create", "-h").stdout
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


BIG = "b" * (9 * 1024 * 1024)  # over the 8 MiB an event may have
TOO_LARGE = (
    "event of 9,437,184 bytes is over the limit of 8,388,608 bytes: split it into smaller ones"
)


@pytest.mark.parametrize("before", [3, 2500])
def test_write_keeps_the_lines_before_one_it_refuses_and_says_how_many(sluice, before):
    """The lines read since the last flush (all of them, for 3; 500 after two flushes of
    1,000, for 2,500) used to be dropped; nothing after the refused line is written."""
    sluice("store", "create", "site/net")
    lines = "".join(f"line{i}\n" for i in range(before))
    proc = sluice("store", "write", "site/net", stdin=f"{lines}{BIG}\nafter\n", ok=False)
    line = (
        f"sluice: error: line {before + 1}: {TOO_LARGE}; wrote {before:,} events to site/net"
        " before it (the lines after it were not read)"
    )
    refused(proc, line, exit_code=1)
    assert proc.stderr.count("\n") == 1
    assert sluice("store", "read", "site/net").stdout == lines


def test_write_says_what_it_wrote_when_the_stream_is_sealed_under_it(sluice, tmp_path):
    sluice("store", "create", "site/net")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLUICE_STORE": f"embedded:{tmp_path / 's'}"}
    writer = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "store", "write", "site/net"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        writer.stdin.write("a\nb\n")
        writer.stdin.flush()
        deadline = time.monotonic() + 30
        while sluice("store", "read", "site/net").stdout != "a\nb\n":  # flushed on a pause
            assert time.monotonic() < deadline, "the first lines were never flushed"
            time.sleep(0.05)
        sluice("store", "seal", "site/net")
        writer.stdin.write("c\n")
        writer.stdin.close()
        err = writer.stderr.read()
    finally:
        writer.kill()
        writer.wait(timeout=30)
    assert writer.returncode == 1
    assert err == (
        "sluice: error: stream site/net is sealed: it accepts no more writes; of the 3 lines"
        " read, 2 are known written to site/net and 1 may not have been\n"
    )
    assert sluice("store", "read", "site/net").stdout == "a\nb\n"


def test_write_refuses_a_bad_routing_key_before_reading_a_line(sluice):
    sluice("store", "create", "site/net")
    proc = sluice("store", "write", "site/net", "-k", "k" * 1025, stdin="a\n", ok=False)
    assert proc.stderr.startswith("sluice: error: invalid routing key 'kkk")
    assert "line 1" not in proc.stderr and proc.stderr.count("\n") == 1


def test_create_of_a_stream_that_exists_otherwise_says_how_it_differs(sluice):
    sluice("store", "create", "a/b")
    proc = sluice("store", "create", "a/b", "--segments", "4", "--retention-bytes", "100", ok=False)
    line = (
        "sluice: error: a/b exists, created with 1 segment and no retention policy, not the"
        " 4 segments and --retention-bytes 100 asked for (`sluice store scale a/b` splits and"
        " merges its segments; no command changes a retention policy: create another stream,"
        " or seal, delete and create a/b again)"
    )
    refused(proc, line, exit_code=1)
    info = json.loads(sluice("store", "info", "a/b").stdout)
    assert (len(info["segments"]), info["retention"]["max_bytes"]) == (1, None)
    for asked in ((), ("--segments", "1")):  # as it is: idempotent
        assert sluice("store", "create", "a/b", *asked).stdout == "exists a/b\n"


def test_create_compares_the_segments_a_stream_was_created_with_and_its_whole_policy(sluice):
    sluice("store", "create", "a/b", "--segments", "2", "--retention-bytes", "1000")
    sluice("store", "scale", "a/b", "--split", "1")  # 3 active segments now, 2 at creation
    same = ("--segments", "2", "--retention-bytes", "1000")
    assert sluice("store", "create", "a/b", *same).stdout == "exists a/b\n"
    proc = sluice("store", "create", "a/b", "--segments", "3", ok=False)
    line = (
        "sluice: error: a/b exists, created with 2 segments, not the 3 segments asked for"
        " (`sluice store scale a/b` splits and merges its segments)"
    )
    refused(proc, line, exit_code=1)
    for asked in (
        ("--retention-seconds", "60"),
        ("--retention-bytes", "1000", "--retention-seconds", "60"),
    ):
        proc = sluice("store", "create", "a/b", *asked, ok=False)
        assert proc.stderr.startswith(
            "sluice: error: a/b exists, created with a retention policy (at most 1,000 bytes),"
            f" not the {' '.join(asked)} asked for (no command changes a retention policy"
        )


def test_delete_and_scale_say_what_sealing_means_for_them(sluice):
    sluice("store", "create", "a/b")
    proc = sluice("store", "delete", "a/b", ok=False)
    line = "sluice: error: stream a/b must be sealed before it is deleted (`sluice store seal a/b`)"
    refused(proc, line, exit_code=1)
    sluice("store", "seal", "a/b")
    for how in (("--split", "0"), ("--auto", "events_per_second:1")):
        proc = sluice("store", "scale", "a/b", *how, ok=False)
        line = "sluice: error: stream a/b is sealed, so it cannot be scaled: its segments stay"
        refused(proc, f"{line} as they are", exit_code=1)


@pytest.mark.parametrize(
    ("stream", "line"),
    [
        ("../b", "invalid scope name '..': it starts with '.', which a name must not"),
        ("./b", "invalid scope name '.': it starts with '.', which a name must not"),
        ("-/b", "invalid scope name '-': it starts with '-', which a name must not"),
        ("a/.hidden", "invalid stream name '.hidden': it starts with '.', which a name must not"),
        ("a/x@y", "invalid stream name 'x@y': it contains '@', which is not allowed"),
    ],
)
def test_a_name_refused_says_the_rule_it_breaks(sluice, stream, line):
    proc = sluice("store", "create", "--", stream, ok=False)
    rule = "(use 1-255 ASCII letters, digits, '-', '_' or '.', not starting with '.' or '-')"
    refused(proc, f"sluice: error: {line} {rule}", exit_code=1)


def test_a_position_the_store_refuses_is_quoted_with_its_whole_cut(sluice):
    sluice("store", "create", "a/b")
    sluice("store", "write", "a/b", stdin="x\ny\n")
    tail = sluice("store", "cut", "a/b").stdout.strip()
    bad = tail.rsplit("~", 1)[0] + "~0-1"  # inside the first event
    boundary = "offset 1 of segment 0 is not an event boundary"
    for args in (
        ("read", "a/b", "--from", bad),
        ("read", "a/b", "--to", bad),
        ("truncate", "a/b", bad),
    ):
        proc = sluice("store", *args, ok=False)
        assert proc.stderr.startswith(f"sluice: error: invalid stream cut {bad!r}: {boundary}")
        assert proc.stderr.count("\n") == 1


def test_a_cut_naming_a_newer_stream_id_says_it_is_of_another_stream(sluice):
    sluice("store", "create", "a/b")
    sluice("store", "create", "a/c")
    mine = json.loads(sluice("store", "info", "a/b").stdout)["tail"].split("~")[3]
    other = json.loads(sluice("store", "info", "a/c").stdout)["tail"].split("~")[3]
    assert int(other) > int(mine)
    cut = f"v2~a~b~{other}~0-0"
    proc = sluice("store", "read", "a/b", "--from", cut, ok=False)
    line = (
        f"sluice: error: invalid stream cut {cut!r}: it is a cut of another stream (stream id"
        f" {other}, which is a/c in this store: a cut from another store?), not of a/b, which"
        f" is stream id {mine}: its positions mean nothing in a/b; take a cut of a/b (head,"
        " tail, a reader group's) instead"
    )
    refused(proc, line, exit_code=1)


NOT_WITH = "not allowed with argument"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("read", "a/b", "--follow", "--to", "tail"), f"argument --to: {NOT_WITH} --follow/-f"),
        (("read", "a/b", "--to", "tail", "-f"), f"argument --follow/-f: {NOT_WITH} --to"),
        (
            ("scale", "a/b", "--merge", "3,4", "--parts", "3"),
            f"argument --parts: {NOT_WITH} --merge",
        ),
        (
            ("scale", "a/b", "--parts", "3", "--auto", "events_per_second:5"),
            f"argument --parts: {NOT_WITH} --auto",
        ),
        (
            ("scale", "a/b", "--split", "0", "--window", "5"),
            f"argument --window: {NOT_WITH} --split",
        ),
        (
            ("scale", "a/b", "--merge", "0,1", "--window", "5"),
            f"argument --window: {NOT_WITH} --merge",
        ),
    ],
)
def test_options_that_would_be_ignored_together_are_refused(sluice, args, line):
    sluice("store", "create", "a/b", "--segments", "2")
    before = sluice("store", "info", "a/b").stdout
    proc = sluice("store", *args, ok=False)
    refused(proc, f"sluice store {args[0]}: error: {line}", exit_code=2)
    assert sluice("store", "info", "a/b").stdout == before


def test_scale_options_that_go_together_still_work(sluice):
    sluice("store", "create", "a/b")
    out = sluice("store", "scale", "a/b", "--parts", "3", "--split", "0").stdout
    assert out == "created segments [1, 2, 3]; active segments [1, 2, 3]\n"
    out = sluice("store", "scale", "a/b", "--auto", "events_per_second:5", "--window", "1").stdout
    assert out.startswith("created segments ")


def test_store_files_this_user_may_not_use_are_one_line_and_no_half_made_stream(tmp_path):
    """A segment file it may not open, or a data directory it may not add to: one line that
    names the path (was a PermissionError traceback), and a `create` that failed leaves no
    stream behind (a retry said `exists`, with no directory for it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLUICE_STORE": f"embedded:{tmp_path / 's'}"}

    def sluice(*args: str, limited: bool = False) -> subprocess.CompletedProcess:
        prefix = without_dac_override() if limited else []
        command = [*prefix, sys.executable, "-m", "pipeline.cli", *args]
        return subprocess.run(
            command, input="x\n", capture_output=True, text=True, env=env, timeout=60, check=False
        )

    assert sluice("store", "create", "g/s").returncode == 0
    assert sluice("store", "write", "g/s").returncode == 0
    data = tmp_path / "s" / "data"
    segment = data / "1" / "0.seg"
    segment.chmod(0o400)
    data.chmod(0o500)
    try:
        for args, path in ((("store", "read", "g/s"), segment), (("store", "create", "g/t"), data)):
            proc = sluice(*args, limited=True)
            assert proc.returncode == 1, proc.stderr
            assert proc.stderr.startswith(f"sluice: error: permission denied: {path}")
            assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    finally:
        data.chmod(0o700)
        segment.chmod(0o600)
    assert sluice("store", "create", "g/t").stdout == "created g/t\n"
    assert sluice("store", "verify").returncode == 0


def test_a_store_that_cannot_be_opened_says_why(sluice, tmp_path):
    """A store path that is (or is under) a file, and a store whose catalog cannot be written:
    one line each that says what is in the way (was `[Errno 17] File exists` and `attempt to
    write a readonly database`, naming no file)."""
    file = tmp_path / "afile"
    file.write_text("")
    for uri in (file, file / "sub"):
        proc = sluice("--store", f"embedded:{uri}", "store", "create", "a/b", ok=False)
        assert f"{file} is a file, not a directory: give a store's directory" in proc.stderr
    sluice("store", "create", "g/s")
    store = tmp_path / "s"
    modes = {path: path.stat().st_mode for path in [store, *store.rglob("*")]}
    for path, mode in modes.items():
        path.chmod(mode & ~0o222)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SLUICE_STORE": f"embedded:{store}"}
        command = [*without_dac_override(), sys.executable, "-m", "pipeline.cli"]
        proc = subprocess.run(
            [*command, "store", "read", "g/s"], capture_output=True, text=True, env=env, check=False
        )
    finally:
        for path, mode in modes.items():
            path.chmod(mode)
    assert proc.returncode == 1
    assert f"its catalog {store / 'catalog.db'} cannot be written" in proc.stderr
    assert "make its directory and files writable" in proc.stderr
