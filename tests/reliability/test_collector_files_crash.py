"""Files ingested exactly once although the collector is SIGKILLed between every step:
after validating a file, inside and after each SQLite commit of its rows and progress, after
the commit that marks it done, after deleting it, and at every step of the sender's
two-phase commit. Each scenario kills one fresh collector at one point, restarts it, and
checks that the stream holds every row of every file exactly once, in file-name order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectors.buffer import Buffer
from tests.collectors.conftest import REPO, read_payloads, toml_text, wait_for

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("collector_worker.py")
STREAM = "lab/files"
FILES = {"a-001.csv": 10, "a-002.csv": 500, "a-003.csv": None, "a-004.csv": 7}  # None: empty
STEPS = [
    "files.after_validate:1",
    "files.after_validate:2",
    "buffer.in_append_txn:1",
    "buffer.in_append_txn:2",
    "buffer.in_append_txn:3",
    "driver.after_append:2",
    "files.after_chunk:1",
    "files.after_chunk:3",
    "files.after_cleanup:1",
    "files.after_cleanup:3",
    "sender.after_record_open:1",
    "sender.mid_write:2",
    "sender.after_flush:1",
    "sender.in_ready_txn:1",
    "sender.after_ready:1",
    "sender.after_ready:3",
    "sender.after_stream_commit:2",
    "sender.in_forget_txn:1",
    "sender.after_forget:1",
]


def expected_rows() -> list[int]:
    rows: list[int] = []
    for name, count in FILES.items():
        base = int(name[2:5]) * 1000
        rows += [] if count is None else list(range(base, base + count))
    return rows


def setup(root: Path) -> tuple[Path, Path]:
    inbox = root / "inbox"
    inbox.mkdir(parents=True)
    old = time.time_ns() - 60_000_000_000
    for name, count in FILES.items():
        path = inbox / name
        if count is None:
            path.write_bytes(b"")
        else:
            base = int(name[2:5]) * 1000
            lines = ["seq,reading\n"] + [f"{i},{i % 17}\n" for i in range(base, base + count)]
            path.write_text("".join(lines))
        os.utime(path, ns=(old, old))
    table = {
        "driver": "files",
        "stream": STREAM,
        "directories": [str(inbox)],
        "delete_completed": True,
        "settle_ms": 0,
        "scan_interval_ms": 50,
        "samples_per_event": 2,
        "max_events_per_txn": 40,
    }
    collector = {
        "store": f"embedded:{root / 'streams'}",
        "state_dir": str(root / "state"),
        "drain_timeout_seconds": 30,
    }
    config = root / "collector.toml"
    config.write_text(toml_text(collector, {"files": table}))
    return config, inbox


def start(config: Path, failpoint: str | None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SLUICE_COLLECTOR_FAILPOINTS", None)
    if failpoint:
        env["SLUICE_COLLECTOR_FAILPOINTS"] = failpoint
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_clean_to_the_end(root: Path, config: Path, inbox: Path) -> None:
    process = start(config, None)
    buffer = Buffer(root / "state" / "files.db", 10)

    def finished() -> bool:
        started = buffer.meta().get("pid") == str(process.pid)  # its signal handlers are set
        return (
            started
            and not any(inbox.iterdir())
            and buffer.depth() == 0
            and not buffer.ledger.txns()
        )

    def state() -> str:
        waiting = [p.name for p in inbox.iterdir()]
        return (
            f"files waiting {waiting}, {buffer.depth()} events buffered, transactions"
            f" {buffer.ledger.txns()}, sender {buffer.meta().get('sender_state')!r}"
        )

    # Alone a clean run takes a few seconds; beside the Spark kill suites of `make test`, on
    # 2 cores, some more.
    wait_for(finished, timeout=120, explain=state)
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0, process.stderr.read()


def check(root: Path) -> None:
    rows = [row["seq"] for payload in read_payloads(root / "streams", STREAM) for row in payload]
    assert rows == expected_rows()
    buffer = Buffer(root / "state" / "files.db", 10)
    states = buffer.conn.execute("SELECT state, count(*) FROM files GROUP BY state").fetchall()
    assert all(state == "done" for state, _ in states)
    assert not (root / "state" / "files.failed").exists()


@pytest.mark.parametrize("failpoint", STEPS)
def test_a_crash_at_each_step_of_file_ingestion(tmp_path, failpoint):
    config, inbox = setup(tmp_path)
    doomed = start(config, failpoint)
    assert doomed.wait(60) == -signal.SIGKILL, doomed.stderr.read()
    assert f"failpoint {failpoint.split(':')[0]}: SIGKILL" in doomed.stderr.read()
    run_clean_to_the_end(tmp_path, config, inbox)
    check(tmp_path)


def test_crash_after_crash_on_the_same_state(tmp_path):
    config, inbox = setup(tmp_path)
    for failpoint in STEPS:
        process = start(config, failpoint)
        try:
            process.wait(timeout=3)  # a step already behind us is not reached again: kill anyway
        except subprocess.TimeoutExpired:
            process.kill()
        assert process.wait() == -signal.SIGKILL
    run_clean_to_the_end(tmp_path, config, inbox)
    check(tmp_path)
