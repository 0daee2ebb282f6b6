"""`make demo` in its short form, end to end, plus the demo's own helpers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.demo import DemoError, collector_environ, pick_interface
from pipeline.settings import load_settings

REPO = Path(__file__).resolve().parents[1]


def fake_sysfs(root: Path, counters: dict[str, int]) -> Path:
    for name, value in counters.items():
        stats = root / name / "statistics"
        stats.mkdir(parents=True)
        (stats / "rx_bytes").write_text(f"{value}\n")
        (stats / "tx_bytes").write_text("0\n")
    return root


def test_loopback_is_chosen_when_no_other_interface_is_busy(tmp_path):
    sysfs = fake_sysfs(tmp_path / "net", {"lo": 10, "eth0": 5})
    assert pick_interface(sysfs) == "lo"  # counters do not move during the probe


def test_no_interfaces_is_a_clear_error(tmp_path):
    with pytest.raises(DemoError, match=re.escape("no interface statistics under")):
        pick_interface(tmp_path / "missing")


def test_collectors_of_sluice_toml_become_collector_variables(_sluice_home):
    settings = load_settings(REPO / "sluice.toml", environ={}, home=_sluice_home)
    env = collector_environ(settings, "eth7", {"PRAVEGA_SENSOR_COLLECTOR_OLD_CLASS": "x", "A": "b"})
    assert env["PRAVEGA_SENSOR_COLLECTOR_NETWORK_CLASS"] == "nic"
    assert env["PRAVEGA_SENSOR_COLLECTOR_NETWORK_INTERFACE"] == "eth7"
    assert env["PRAVEGA_SENSOR_COLLECTOR_NETWORK_STREAM"] == "examples/network"
    assert env["PRAVEGA_SENSOR_COLLECTOR_GENERATOR_CLASS"] == "generator"
    assert "PRAVEGA_SENSOR_COLLECTOR_OLD_CLASS" not in env  # not a stale instance
    assert env["A"] == "b"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.usefixtures("product_defaults")
def test_make_demo_short(_sluice_home):
    """What `make demo DEMO_ARGS=--short` runs: the demo, which starts the warm Spark
    (`sluice spark start`), attaches its jobs to it and stops it at the end."""
    env = {**os.environ, "SLUICE_HOME": str(_sluice_home)}
    spark = [sys.executable, "-m", "pipeline.cli", "spark"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.demo", "--short", "--warm-spark"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,  # Dagster's automation: the daemon, the run worker, the runs
            check=False,
        )
        status = subprocess.run([*spark, "status"], cwd=REPO, env=env, check=False)
    finally:
        subprocess.run([*spark, "stop"], cwd=REPO, env=env, timeout=300, check=False)
    assert status.returncode == 3  # the demo stopped the warm Spark it started
    assert "warm Spark" not in done.stderr, done.stderr  # it started
    assert (_sluice_home / "spark" / "connect.log").exists()
    out = done.stdout
    logs = _sluice_home / "demo"
    assert done.returncode == 0, f"{done.stderr}\n{out}\n" + "\n".join(
        p.read_text()[-3000:] for p in sorted(logs.glob("*.log"))
    )
    rows = {
        m.group(1): [int(x) for x in m.groups()[1:]]
        for m in re.finditer(
            r"^(network|generator)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$", out, re.M
        )
    }
    for name, (collected, mirrored, exported, quarantined, _) in rows.items():
        assert collected > 0 and mirrored == collected, name
        assert exported > 0 and quarantined == 0, name
    assert set(rows) == {"network", "generator"}
    passed, total = map(int, re.search(r"asset checks: (\d+)/(\d+) passed", out).groups())
    assert passed == total > 0
    slices = rows["network"][4]
    assert slices > 0  # the loopback bursts are bookmarked
    assert f"replays ({slices}):" in out  # one replay per slice
    assert "FROM rates GROUP BY Interface" in out and re.search(r"^lo\s+\d+", out, re.M)
    assert "make ui" in out
    assert list((_sluice_home / "plots").glob("*.png"))

    # every run was launched by the automation, and the summary says which launched what
    assert "launched by hand: 0 runs" in out
    launched = {
        m.group(1): int(m.group(2))
        for m in re.finditer(
            r"^  (?:sensor|schedule) +(\S+): (?:on|off), .* (\d+) runs?$", out, re.M
        )
    }
    assert launched["edge_tail_sensor"] >= 2  # a catch-up of each family, at least
    assert launched["new_slices_sensor"] == slices  # a replay per slice
    assert launched["nightly_replays_network"] >= 1  # the revalidation
    # the analytics views: by their automation condition, or the sensor that catches what it
    # misses (it looks every 5 s in the demo, the condition's sensor every 30 s)
    views = launched["default_automation_condition_sensor"] + launched["analytics_views_sensor"]
    assert views >= 1
    assert "schedule nightly_replays_network: off" in out  # turned off after its first run
    assert re.search(
        r"^  sl-\S+  network/replay_nic_throughput \(run \w{8} against run \w{8}\): "
        r"same cuts, counts, model version and metrics$",
        out,
        re.M,
    )

    import dagster as dg

    with dg.DagsterInstance.from_config(str(_sluice_home / "dagster")) as instance:
        runs = instance.get_runs()
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        by_launcher = {}
        for run in runs:
            who = run.tags.get("dagster/sensor_name") or run.tags.get("dagster/schedule_name")
            by_launcher.setdefault(who, set()).add(run.job_name)
        assert by_launcher["edge_tail_sensor"] == {"catch_up_network", "catch_up_generator"}
        assert by_launcher["new_slices_sensor"] == {"replay_network"}
        assert by_launcher["nightly_replays_network"] == {"replay_network"}
        assert None not in by_launcher  # nothing launched by hand
        (revalidation,) = [r for r in runs if r.tags.get("sluice/replay_reason") == "revalidate"]
        assert revalidation.tags["dagster/schedule_name"] == "nightly_replays_network"
        # the daemon and everything it started are gone
        states = {s.instigator_name: s.is_running for s in instance.all_instigator_state()}
        assert states["edge_tail_sensor"] and not states["nightly_replays_network"]
    daemons = subprocess.run(
        ["pgrep", "-f", f"dagster.*{_sluice_home}"], capture_output=True, text=True, check=False
    )
    assert daemons.stdout == "", daemons.stdout
