"""`sluice collect` as a process: SIGTERM drains, status, one owner per buffer, edge imports."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from collectors.buffer import Buffer

from .conftest import REPO, read_payloads, run_cli, wait_for


def start(config_path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(config_path), *extra],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_drains_the_buffer_and_status_tells_the_story(write_config, store_dir, tmp_path):
    path = write_config(
        {
            "gen": {
                "driver": "generator",
                "stream": "lab/gen",
                "samples_per_sec": 20_000,
                "samples_per_event": 500,
            }
        }
    )
    process = start(path)
    wait_for(lambda: len(read_payloads(store_dir, "lab/gen")) >= 5)

    status = run_cli("collect", "--config", str(path), "status")
    assert status.returncode == 0, status.stderr
    assert "gen (generator -> lab/gen): running, sender sending, healthy" in status.stdout
    assert "last committed sample: 20" in status.stdout
    assert "transactions: flush protocol (txn_protocol = auto); awaiting" in status.stdout

    second = run_cli("collect", "--config", str(path))
    assert second.returncode == 1
    assert second.stderr.strip().endswith(
        "is in use by another running collector; stop that one first (two senders on one "
        "buffer could send a batch twice)"
    )
    assert len(second.stderr.strip().splitlines()) == 1

    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, process.stderr.read()
    log = process.stderr.read()
    assert "SIGTERM received: stopping drivers and draining buffers" in log
    assert "gen: buffer drained" in log

    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    next_seq = buffer.cursor("generator").value["next_seq"]
    sequences = [s for p in read_payloads(store_dir, "lab/gen") for s in p["Sequence"]]
    assert sequences == list(range(next_seq))  # everything generated reached the stream

    report = json.loads(run_cli("collect", "--config", str(path), "status", "--json").stdout)
    (gen,) = report
    assert gen["running"] is False and gen["sender_state"] == "stopped"
    assert gen["last_stop"] == "SIGTERM received; 0 events left in the buffer"
    assert (gen["txn_protocol"], gen["txn_protocol_used"]) == ("auto", "flush")
    assert gen["depth_events"] == 0 and gen["pending_txns"] == 0
    assert gen["counters"]["samples_committed"] == next_seq
    assert gen["last_committed_ns"] <= time.time_ns()


def test_status_of_an_instance_that_never_ran(write_config):
    path = write_config({"gen": {"driver": "generator", "stream": "lab/gen"}})
    result = run_cli("collect", "--config", str(path), "status")
    assert result.returncode == 0
    assert "gen (generator -> lab/gen): not running, never started" in result.stdout
    assert "transactions: txn_protocol = auto, not connected yet;" in result.stdout


BLOCKER = """
import sys
BLOCKED = ("pyspark", "py4j", "dagster", "duckdb", "pandas", "fastavro", "matplotlib", "grpc")

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is not part of the edge install")

sys.meta_path.insert(0, Block())
"""


def test_sluice_collect_starts_with_the_edge_extra_only():
    script = BLOCKER + "from pipeline.cli import main\nsys.exit(main(['collect', '--help']))\n"
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr[-600:]


def test_the_collector_imports_nothing_beyond_the_edge_extra():
    """Run the collector's modules with pyspark, dagster, duckdb and friends made unimportable,
    as on an edge box installed with the `edge` extra only."""
    script = BLOCKER + textwrap.dedent(
        """
        import importlib
        for module in (
            "pipeline.cli.collect", "collectors.service", "collectors.status",
            "collectors.drivers.nic", "collectors.nic_sampler", "collectors.tabular",
            "collectors.drivers.accelerometer", "collectors.drivers.files",
            "collectors.drivers.mqtt", "collectors.drivers.generator",
            "pipeline.streams.embedded",
        ):
            importlib.import_module(module)
        import pyarrow.parquet, paho.mqtt.client, msgspec  # the edge extra itself
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
        print("loaded:", loaded)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "loaded: []"
