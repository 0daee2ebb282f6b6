"""A damaged buffer file, as an operator at the edge meets one: emptied, overwritten,
truncated, its write-ahead log lost, locked by another program, a driver cursor that
cannot be used. Each is refused with a typed error naming the file; the collector never
starts over at sequence 0 on it (that would send the stream samples it already holds)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time

import pytest

from collectors.buffer import Buffer
from collectors.buffer import file as buffer_file
from collectors.errors import BufferBusy, BufferDamaged, BufferUnusable, CursorUnreadable
from collectors.service import run_service
from pipeline.failpoints import Failpoints

from .conftest import collect_status, read_payloads, run_cli, wait_for


def gen_table(**extra: object) -> dict:
    table = {"driver": "generator", "stream": "lab/gen", "samples_per_event": 100}
    return table | {"samples_per_sec": 1e9, "max_samples": 300} | extra


def sequences(store_dir) -> list[int]:
    return [s for p in read_payloads(store_dir, "lab/gen") for s in p["Sequence"]]


def sent_once(make_config, store_dir, **extra):
    """A collector that sent 300 samples and stopped cleanly; its config."""
    config = make_config({"gen": gen_table(**extra)})
    assert run_service(config, Failpoints(), install_signals=False) == 0
    assert sequences(store_dir) == list(range(300))
    return config


def start(config) -> None:
    run_service(config, Failpoints(), install_signals=False)


def test_an_emptied_buffer_is_refused_not_started_over_at_zero(
    make_config, write_config, store_dir
):
    # a zero-byte file was taken for a new buffer: the generator numbered from 0 again
    config = sent_once(make_config, store_dir)
    path = config.instances[0].buffer_file
    path.write_bytes(b"")
    expected = f"buffer {path} is damaged: it is empty (0 bytes)"
    with pytest.raises(BufferDamaged, match=re.escape(expected)):
        start(make_config({"gen": gen_table(max_samples=600)}))
    assert sequences(store_dir) == list(range(300))
    assert path.stat().st_size == 0  # left as it was
    report = collect_status(write_config({"gen": gen_table()}))["gen"]
    assert report["sender_state"].startswith("buffer damaged: it is empty (0 bytes)")


def test_a_lost_write_ahead_log_after_a_kill_is_refused(make_config, write_config, store_dir):
    # the log held the schema and every commit since the start: without it the file looked
    # new, and the generator numbered from 0 again
    path = write_config({"gen": gen_table(samples_per_sec=2000, max_samples=3000)})
    killed = run_cli(
        "collect",
        "--config",
        str(path),
        env={"SLUICE_COLLECTOR_FAILPOINTS": "sender.after_forget:3"},
    )
    assert killed.returncode == -9, killed.stderr
    sent = sequences(store_dir)
    assert sent == list(range(len(sent))) and sent
    buffer = make_config({"gen": gen_table()}).instances[0].buffer_file
    buffer_file.wal_path(buffer).unlink()
    expected = f"buffer {buffer} is damaged: its write-ahead log {buffer.name}-wal is gone"
    report = collect_status(path)["gen"]
    assert report["problems"][0].startswith("buffer damaged: its write-ahead log")
    with pytest.raises(BufferDamaged, match=re.escape(expected)):
        start(make_config({"gen": gen_table(samples_per_sec=2000, max_samples=6000)}))
    assert sequences(store_dir) == sent


def test_a_clean_stop_leaves_no_log_and_starts_again(make_config, store_dir):
    config = sent_once(make_config, store_dir)
    assert not buffer_file.wal_path(config.instances[0].buffer_file).exists()
    start(make_config({"gen": gen_table(max_samples=600)}))
    assert sequences(store_dir) == list(range(600))


def test_a_truncated_buffer_is_refused_as_damaged(make_config, store_dir):
    config = sent_once(make_config, store_dir)
    path = config.instances[0].buffer_file
    os.truncate(path, 65536)
    with pytest.raises(BufferDamaged, match=re.escape(f"buffer {path} is damaged: SQLite reports")):
        start(config)
    assert sequences(store_dir) == list(range(300))


def test_a_buffer_with_an_overwritten_header_says_what_moving_it_aside_costs(
    make_config, store_dir
):
    config = sent_once(make_config, store_dir)
    path = config.instances[0].buffer_file
    with path.open("r+b") as fh:
        fh.write(os.urandom(100))
    expected = "if it was this collector's buffer, its header is damaged"
    with pytest.raises(BufferUnusable, match=re.escape(expected)) as caught:
        start(config)
    assert "a generator numbers from 0 again" in str(caught.value)


def test_a_buffer_locked_by_another_program_is_named_not_a_traceback(
    make_config, store_dir, monkeypatch
):
    # an sqlite3 shell holding a write transaction: "database is locked" with a traceback
    config = sent_once(make_config, store_dir)
    path = config.instances[0].buffer_file
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
            " c.execute('BEGIN EXCLUSIVE'); print('held', flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(buffer_file, "LOCKED_WAIT_SECONDS", 0.5)
        expected = f"buffer {path}: locked by another process for over 0s"
        with pytest.raises(BufferBusy, match=re.escape(expected)):
            start(config)
    finally:
        holder.kill()
        holder.wait()


def test_status_of_a_state_dir_that_is_a_file_is_a_report_not_a_traceback(write_config, tmp_path):
    state = tmp_path / "state"
    state.write_text("not a directory")
    report = collect_status(write_config({"gen": gen_table()}))["gen"]
    assert report["running"] is False


def test_status_of_a_buffer_that_is_a_directory_says_so(write_config, tmp_path):
    path = write_config({"gen": gen_table()})
    (tmp_path / "state" / "gen.db").mkdir(parents=True)
    report = collect_status(path)["gen"]
    assert report["sender_state"].startswith("buffer unreadable:")
    assert "is not a file" in report["sender_state"]


def set_cursor(path, version: object, value: str) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "UPDATE cursor SET version = ?, value = ? WHERE name = 'generator'", (version, value)
        )
    conn.close()


def driver_errors(path) -> list[str]:
    buffer = Buffer(path, 10)
    try:
        return [m for (m,) in buffer.conn.execute("SELECT message FROM errors ORDER BY id")]
    finally:
        buffer.close()


@pytest.mark.parametrize(
    "case",
    [
        (2, json.dumps({"next_seq": 300}), "has version 2, this collector reads version 1"),
        (1, json.dumps({}), "has no usable next_seq ({}: a whole number >= 0"),
        (1, json.dumps({"next_seq": "300"}), "has no usable next_seq"),
        (1, json.dumps({"next_seq": -5}), "has no usable next_seq"),
        (1, json.dumps({"next_seq": True}), "has no usable next_seq"),
        (1, "{not json", "is damaged (version 1, value '{not json')"),
    ],
)
def test_a_generator_cursor_it_cannot_use_is_refused(make_config, service, store_dir, case):
    # the version was never checked, and a missing or odd next_seq was a KeyError or
    # a ValueError, or numbered from a guess (a negative number, 1 for true)
    version, value, expected = case
    config = sent_once(make_config, store_dir)
    path = config.instances[0].buffer_file
    set_cursor(path, version, value)
    running = service(make_config({"gen": gen_table(max_samples=600)}))
    wait_for(lambda: any("CursorUnreadable" in m for m in driver_errors(path)), timeout=30)
    time.sleep(0.3)
    assert running.stop() == 0
    message = next(m for m in driver_errors(path) if "CursorUnreadable" in m)
    assert f"buffer {path}: the driver's cursor 'generator' {expected}" in message
    assert sequences(store_dir) == list(range(300))


def test_a_cursor_error_is_typed_for_a_direct_reader(tmp_path):
    path = tmp_path / "b.db"
    buffer = Buffer(path, 10)
    try:
        buffer.conn.execute("INSERT INTO cursor (name, version, value) VALUES ('x', 1, '[1]')")
        with pytest.raises(CursorUnreadable, match=re.escape("cursor 'x' is damaged")):
            buffer.cursor("x")
    finally:
        buffer.close()
