"""`sluice run console`: events as readable lines, from head or tail, following."""

from __future__ import annotations

import io
import threading
import time
from datetime import UTC, datetime

import pytest

from pipeline import cli
from pipeline.jobs.console import ConsoleSpec, console, format_event
from pipeline.jobs.runner import RunOptions

pytestmark = pytest.mark.spark


def row(payload: bytes, key: str | None = "k1") -> dict:
    return {
        "stream": "edge/net",
        "segment": 1,
        "offset": 2048,
        "routing_key": key,
        "payload": payload,
        "ingest_time": datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC),
    }


def test_an_event_line():
    line = format_event(row(b'{"a": 1}'), 200)
    assert line == '2026-01-02T03:04:05.678Z  edge/net  1@2048  key=k1  {"a": 1}'


def test_long_payloads_are_cut_and_binary_is_hex():
    long = format_event(row(b"x" * 500, key=None), 40)
    assert long.endswith("x" * 40 + "… (500 bytes)") and "key=-" in long
    assert "<not UTF-8> ff00" in format_event(row(b"\xff\x00abc"), 40)


def test_console_prints_from_head(spark, store, store_dir, capsys):
    store.create_stream("edge/net", segments=2)
    with store.writer("edge/net") as writer:
        for i in range(12):
            writer.write(f'{{"n": {i}}}'.encode(), routing_key=f"k{i % 3}")
    code = cli.main(["--store", f"embedded:{store_dir}", "run", "console", "--stream", "edge/net"])
    captured = capsys.readouterr()
    assert code == 0
    lines = captured.out.strip().splitlines()
    assert len(lines) == 12
    assert sorted(int(line.rsplit(": ", 1)[1].rstrip("}")) for line in lines) == list(range(12))
    assert "12 events" in captured.err


def test_console_follows_from_tail(spark, store, store_dir):
    store.create_stream("edge/net", segments=1)
    with store.writer("edge/net") as writer:
        writer.write(b"old", routing_key="a")

    def later():
        time.sleep(4)
        with store.writer("edge/net") as writer:
            writer.write(b"new", routing_key="a")

    out = io.StringIO()
    writer_thread = threading.Thread(target=later)
    writer_thread.start()
    run = RunOptions(mode="continuous", trigger_seconds=0.5, starting="tail", stop_after_seconds=15)
    summary = console(spark, ConsoleSpec("edge/net", f"embedded:{store_dir}"), run, out=out)
    writer_thread.join()
    assert out.getvalue().strip().endswith("key=a  new")
    assert "old" not in out.getvalue()
    assert summary.events == 1
