"""The newcomer's edges of `make demo`: a second run, an interrupted run, a home it cannot use."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.settings import load_settings
from tests import disks

REPO = Path(__file__).resolve().parents[1]
DEMO = [sys.executable, "-m", "pipeline.demo"]


def demo(
    home: Path, *args: str, cwd: Path = REPO, timeout: float = 60
) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLUICE_HOME": str(home)}
    return subprocess.run(
        [*DEMO, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def refused(done: subprocess.CompletedProcess, reason: str) -> None:
    """Exit 1 with one line naming `reason`, before the collectors start, no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert reason in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "collecting for" not in done.stdout


def processes_of(home: Path) -> list[str]:
    """The processes whose environment names `home` as their SLUICE_HOME."""
    found = []
    needle = f"SLUICE_HOME={home}\0".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (proc / "environ").read_bytes() + b"\0":
                found.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:160]!r}")
        except OSError:
            continue
    return found


def previous_demo(home: Path) -> Path:
    """A home as an earlier demo left it: its logs, a slice of the mirror, an export, and the
    warm Spark's state, which is not the demo's to remove."""
    from pipeline.jobs.slices import record_slices, time_window_slice
    from pipeline.streams import open_store

    settings = load_settings(REPO / "sluice.toml", environ={}, home=home)
    family = settings.family("network")
    assert family.bookmark is not None
    with open_store(family.mirror_store_uri) as cloud:
        cloud.create_stream(family.mirror_stream)
        txn = cloud.begin_transaction(family.mirror_stream)
        txn.write(b'{"old": 1}', routing_key="site-1")
        txn.flush()
        txn.commit(time_bounds=(1, 1))
        old = time_window_slice(cloud, family.mirror_stream, 0, 2)
        record_slices(cloud, [old], family.bookmark.slices_stream)
    (home / "demo").mkdir(parents=True)
    (home / "demo" / "collector.log").write_text("an earlier demo's log\n")
    (family.export_dir / "date=2020-01-01").mkdir(parents=True)
    (home / "spark").mkdir()
    (home / "spark" / "connect.log").write_text("the warm Spark's\n")
    return home / "spark" / "connect.log"


# --- refused before anything runs ----------------------------------------------------------


def test_a_home_with_data_no_demo_wrote_is_refused_and_left_alone(tmp_path):
    home = tmp_path / "home"
    (home / "streams").mkdir(parents=True)
    (home / "streams" / "mine").write_text("keep me")
    refused(demo(home, "--short"), "holds Sluice data that no demo wrote (streams)")
    assert (home / "streams" / "mine").read_text() == "keep me"


def test_an_earlier_demo_is_removed_and_the_warm_spark_state_kept(tmp_path, capsys):
    from pipeline.demo import home_held

    home = tmp_path / "home"
    spark_log = previous_demo(home)
    (home / "notes.txt").write_text("not the demo's")
    settings = load_settings(REPO / "sluice.toml", environ={}, home=home)
    with home_held(settings):
        pass
    assert "starting clean: removed the previous demo's" in capsys.readouterr().out
    left = sorted(p.name for p in home.iterdir())
    assert left == ["demo", "notes.txt", "spark"], left
    assert [p.name for p in (home / "demo").iterdir()] == ["lock"]
    assert spark_log.read_text() == "the warm Spark's\n"


def test_a_second_demo_on_a_home_in_use_is_refused(tmp_path):
    home = tmp_path / "home"
    (home / "demo").mkdir(parents=True)
    with (home / "demo" / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        refused(demo(home, "--short"), f"another demo is running on {home}")


def test_no_sluice_toml_in_the_working_directory_says_where_to_run(tmp_path):
    env_home = tmp_path / "home"
    done = demo(env_home, "--short", cwd=tmp_path)
    refused(done, f"no sluice.toml in {tmp_path}")
    assert "make -C" in done.stderr


def test_a_read_only_home_is_one_line(tmp_path):
    with disks.small_disk(tmp_path / "disk", "1m") as disk:
        if disk is None:
            pytest.skip("a read-only disk needs root and mount")
        (disk.path / "home").mkdir()
        disk.read_only()
        refused(demo(disk.path / "home", "--short"), "cannot write under")


def test_a_disk_without_room_for_the_demo_is_refused(tmp_path):
    with disks.small_disk(tmp_path / "disk", "8m") as disk:
        if disk is None:
            pytest.skip("a small disk needs root and mount")
        done = demo(disk.path / "home", "--short")
        refused(done, "MB free on the disk of")
        assert re.search(r"the demo needs \d+ MB", done.stderr)


def test_samples_lost_to_a_full_disk_are_not_a_success(tmp_path):
    from pipeline.demo import DemoError, check_collected

    log = tmp_path / "collector.log"
    log.write_text("INFO started\n")
    check_collected(tmp_path, log)
    log.write_text("WARNING sending failed: cannot write (no space left on its disk)\n")
    with pytest.raises(DemoError, match=re.escape("filled up while they ran: samples were lost")):
        check_collected(tmp_path, log)


# --- whole demos -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.usefixtures("product_defaults")
def test_a_demo_after_an_earlier_one_starts_clean_on_the_warm_spark_it_found(tmp_path):
    """An earlier demo's slice was never replayed by the next demo, which waited for it for
    25 minutes; its events and files were counted again. A warm Spark that ran before the
    demo is used and left running."""
    home = tmp_path / "home"
    previous_demo(home)
    env = {**os.environ, "SLUICE_HOME": str(home)}
    spark = [sys.executable, "-m", "pipeline.cli", "spark"]
    subprocess.run([*spark, "start"], cwd=REPO, env=env, capture_output=True, check=True)
    try:
        done = demo(home, "--seconds", "6", "--warm-spark", timeout=300)
        status = subprocess.run([*spark, "status"], cwd=REPO, env=env, check=False)
    finally:
        subprocess.run([*spark, "stop"], cwd=REPO, env=env, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr + done.stdout
    out = done.stdout
    assert out.startswith("starting clean: removed the previous demo's"), out
    assert "using the warm Spark already running for this home (left running)" in out
    assert status.returncode == 0  # still running after the demo
    rows = re.findall(r"^(network|generator)\s+(\d+)\s+(\d+)\s+\d+\s+\d+\s+(\d+)$", out, re.M)
    assert {r[0] for r in rows} == {"network", "generator"}
    for _, collected, mirrored, _ in rows:
        assert int(collected) == int(mirrored) > 0
    slices = dict((r[0], int(r[3])) for r in rows)["network"]
    assert f"replays ({slices}):" in out  # the earlier slice is gone, not waited for
    assert not list((home / "exports" / "network").glob("date=2020-*"))
    assert processes_of(home) == []


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.usefixtures("product_defaults")
@pytest.mark.parametrize(("signum", "whom"), [(signal.SIGINT, "group"), (signal.SIGTERM, "demo")])
def test_an_interrupted_demo_stops_all_it_started(tmp_path, signum, whom):
    """Ctrl-C (SIGINT to the terminal's process group) or SIGTERM to the demo alone, while
    the collectors run: one line, every process of the demo stopped, the home free again."""
    home = tmp_path / "home"
    env = {**os.environ, "SLUICE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*DEMO, "--seconds", "30"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("collectors are writing"):
                break
        (os.killpg if whom == "group" else os.kill)(proc.pid, signum)
        _, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert f"demo: stopped by {name}" in err and "the next demo starts clean" in err
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 15
    while processes_of(home) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert processes_of(home) == []
    with (home / "demo" / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nothing holds the home
