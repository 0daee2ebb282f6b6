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
def test_make_demo_short(_sluice_home):
    env = {**os.environ, "SLUICE_HOME": str(_sluice_home)}
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.demo", "--short"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
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

    import dagster as dg

    with dg.DagsterInstance.from_config(str(_sluice_home / "dagster")) as instance:
        runs = instance.get_runs()
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        jobs = {r.job_name for r in runs}
        assert {"observe_edge_streams", "catch_up_network", "replay_network"} <= jobs
        assert "refresh_analytics" in jobs
