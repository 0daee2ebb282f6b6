"""Helpers of the Spark tests: streams filled with numbered events under several keys."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from pipeline.spark import connect
from pipeline.streams import StreamStore


@dataclass(frozen=True)
class Written:
    key: str
    seq: int
    payload: bytes


def fill(store: StreamStore, stream: str, count: int, keys: int = 7, first: int = 0) -> list:
    """Append `count` events `{"key", "seq"}`; seq counts up per key across calls."""
    written = []
    with store.writer(stream) as writer:
        for i in range(first, first + count):
            key = f"k{i % keys}"
            payload = json.dumps({"key": key, "seq": i, "pad": "x" * (i % 50)}).encode()
            writer.write(payload, routing_key=key)
            written.append(Written(key, i, payload))
    return written


def per_key_sequences(payloads: list[bytes]) -> dict[str, list[int]]:
    """seq numbers per key, in the order given."""
    found: dict[str, list[int]] = {}
    for payload in payloads:
        event = json.loads(payload)
        found.setdefault(event["key"], []).append(event["seq"])
    return found


@pytest.fixture
def store_uri(store_dir) -> str:
    return f"embedded:{store_dir}"


@pytest.fixture
def source(store) -> str:
    store.create_stream("test/source", segments=2)
    return "test/source"


@pytest.fixture
def fake_server():
    """Start a process that `connect.is_server` takes for the Spark Connect server on a port
    (its command line names the server class and the port) without being one: a sleeper in a
    session of its own, as the server runs. Killed afterwards."""
    started: list[subprocess.Popen] = []

    def start(port: int) -> subprocess.Popen:
        argv = [sys.executable, "-c", "import time; time.sleep(120)", connect.SERVER_CLASS]
        argv.append(f"spark.connect.grpc.binding.port={port}")
        started.append(subprocess.Popen(argv, start_new_session=True))
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
