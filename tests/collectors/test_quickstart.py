"""The shipped quick-start collector runs as shipped, anywhere: NIC on the loopback and the
generator, everything under $SLUICE_HOME; `collect status` without a configuration says how."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pipeline.streams import open_store
from tests.collectors.conftest import REPO, run_cli

QUICKSTART = REPO / "collectors" / "collector.quickstart.toml"


def test_the_quickstart_collects_into_the_home_and_drains_on_sigterm(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLUICE_HOME": str(home)}
    env.pop("SLUICE_STORE", None)
    service = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(QUICKSTART)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(5)
    service.send_signal(signal.SIGTERM)
    output, _ = service.communicate(timeout=60)
    assert service.returncode == 0, output
    with open_store(f"embedded:{home / 'streams'}") as store:
        for stream in ("examples/network", "examples/generated"):
            assert list(store.read(stream)), f"{stream} is empty:\n{output}"
    status = run_cli(
        "collect", "--config", str(QUICKSTART), "status", env={"SLUICE_HOME": str(home)}
    )
    assert "loopback (nic -> examples/network): not running, SIGTERM received" in status.stdout
    assert sorted(p.name for p in (home / "collector").glob("*.db")) == [
        "loopback.db",
        "synthetic.db",
    ]


def test_status_without_a_configuration_says_how_to_give_one(tmp_path):
    done = run_cli("collect", "status", env={"SLUICE_HOME": str(tmp_path)}, cwd=tmp_path)
    assert done.returncode == 1
    assert "no collector instances are configured" in done.stderr
    assert "sluice collect --config FILE" in done.stderr
    assert "collector.quickstart.toml" in done.stderr
