"""MQTT driver against a real mosquitto: batching, quarantine, and no ack before the buffer."""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter

import pytest

from collectors.buffer import Buffer
from pipeline.failpoints import Failpoints

from .conftest import (
    REPO,
    Broker,
    free_port,
    mosquitto_binary,
    read_payloads,
    run_cli,
    running_collector,
    wait_for,
)

STREAM = "lab/mqtt"


def publish(
    port: int, messages: list[tuple[str, bytes]], qos: int = 1, retain: bool = False
) -> None:
    import paho.mqtt.client as mqtt

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="test-publisher", protocol=mqtt.MQTTv311
    )
    client.max_inflight_messages_set(20)
    client.connect("127.0.0.1", port)
    client.loop_start()
    infos = [client.publish(topic, payload, qos, retain) for topic, payload in messages]
    for info in infos:
        info.wait_for_publish(20)
    client.disconnect()
    client.loop_stop()


def received(store_dir) -> list[tuple[str, object]]:
    return [
        (topic, payload)
        for event in read_payloads(store_dir, STREAM)
        for topic, payload in zip(event["Topic"], event["Payload"], strict=True)
        if topic != "sensors/warmup"
    ]


def mqtt_table(port: int, **extra) -> dict:
    return {
        "driver": "mqtt",
        "stream": STREAM,
        "port": port,
        "host": "127.0.0.1",
        "topics": ["sensors/#"],
        "payload_format": "json",
        "samples_per_event": 25,
        "max_inflight": 50,
        "max_delay_ms": 100,
        "client_id": "sluice-test-collector",
    } | extra


def wait_subscribed(port: int, store_dir) -> None:
    """Publish a warm-up message until one reaches the stream: the session is subscribed."""

    def arrived() -> bool:
        publish(port, [("sensors/warmup", b"{}")])
        return any("sensors/warmup" in e["Topic"] for e in read_payloads(store_dir, STREAM))

    wait_for(arrived, timeout=30)


@pytest.mark.parametrize("qos", [1, 2])
def test_messages_become_events_once_in_order(make_config, service, store_dir, mosquitto, qos):
    config = make_config({"mq": mqtt_table(mosquitto.port, qos=qos)})
    running = service(config)
    wait_subscribed(mosquitto.port, store_dir)
    messages = [(f"sensors/{'ab'[i % 2]}", json.dumps({"i": i}).encode()) for i in range(200)]
    messages.insert(57, ("sensors/a", b"{not json"))
    messages.insert(120, ("sensors/b", b'{"v": 1e400}'))  # JSON, but no double holds it
    publish(mosquitto.port, messages, qos=qos)
    wait_for(lambda: len(received(store_dir)) == 200)
    time.sleep(0.5)
    running.stop()
    got = received(store_dir)
    assert sorted(p["i"] for _, p in got) == list(range(200))  # each once
    for topic in ("sensors/a", "sensors/b"):
        order = [p["i"] for t, p in got if t == topic]
        assert order == sorted(order)
    event = read_payloads(store_dir, STREAM)[-1]
    assert list(event) == [
        "TimestampNanos",
        "Topic",
        "Payload",
        "RemoteAddr",
        "LastTimestampFormatted",
    ]
    buffer = Buffer(config.instances[0].buffer_file, 10)
    not_json, too_large = buffer.conn.execute(
        "SELECT source, reason, payload FROM quarantine ORDER BY source"
    ).fetchall()
    assert not_json[0] == "mqtt sensors/a" and not_json[1].startswith("payload is not json")
    assert not_json[2] == b"{not json"
    assert too_large[0] == "mqtt sensors/b"
    assert too_large[1].endswith("the number 1e400 is beyond the range of a double")
    assert buffer.counters()["quarantined"] == 2


def start_cli(config_path, failpoints: str | None = None) -> subprocess.Popen:
    env = {"SLUICE_COLLECTOR_FAILPOINTS": failpoints} if failpoints else {}
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "collect", "--config", str(config_path)],
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    "failpoint",
    [
        "buffer.in_append_txn:3",  # killed inside the SQLite commit of a batch
        "driver.after_append:3",  # killed after the commit, before the PUBACKs
    ],
)
def test_a_killed_collector_loses_no_message(write_config, store_dir, mosquitto, failpoint):
    path = write_config({"mq": mqtt_table(mosquitto.port)})
    first = start_cli(path)  # creates the broker-side session, then stops cleanly
    wait_subscribed(mosquitto.port, store_dir)
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0

    messages = [(f"sensors/{i % 3}", json.dumps({"i": i}).encode()) for i in range(300)]
    publish(mosquitto.port, messages)  # queued by the broker for the stopped collector
    doomed = start_cli(path, failpoint)
    assert doomed.wait(60) == -signal.SIGKILL, doomed.stderr.read()
    assert f"failpoint {failpoint.split(':')[0]}: SIGKILL" in doomed.stderr.read()

    survivor = start_cli(path)
    wait_for(lambda: {p["i"] for _, p in received(store_dir)} == set(range(300)))
    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(60) == 0
    counts = Counter(p["i"] for _, p in received(store_dir))
    duplicated = [i for i, n in counts.items() if n > 1]
    # At-least-once: only messages the killed process buffered whose PUBACK had not reached
    # the broker can come twice, and only twice. paho sends PUBACKs from its network thread,
    # so under load the acknowledgements of all of its (at most 3) appends of at most
    # `samples_per_event` (25) messages may still be unsent when it dies.
    assert max(counts.values()) <= 2
    assert len(duplicated) <= 3 * 25, duplicated


def status_of(path) -> tuple[int, dict, str]:
    result = run_cli("collect", "--config", str(path), "status", "--json", "--check")
    (report,) = json.loads(result.stdout)
    return result.returncode, report, result.stderr


def test_a_broker_that_refuses_connections_is_logged_shown_and_fails_the_health_check(
    write_config, store_dir, tmp_path
):
    """Issue 13: port 1 refuses; the collector says so (log, status, health check), keeps
    retrying with backoff, stops at once when asked, and starts sending when a broker comes."""
    port = free_port()  # closed: nothing listens there yet
    path = write_config(
        {"mq": mqtt_table(port, client_id="sluice-refused")},
        unhealthy_after_seconds=2,
        drain_timeout_seconds=20,
    )
    process = start_cli(path)

    def refused() -> bool:
        return any(e["source"] == "mqtt.connect" for e in status_of(path)[1]["last_errors"])

    wait_for(refused, timeout=30)
    _, report, _ = status_of(path)
    assert report["running"] is True and report["connected"] is False
    assert report["connection"].startswith(f"broker 127.0.0.1:{port}: cannot connect: ")
    assert "Connection refused" in report["last_errors"][0]["message"]
    wait_for(lambda: status_of(path)[0] == 1, timeout=30)  # after unhealthy_after_seconds
    _, report, stderr = status_of(path)
    assert report["healthy"] is False
    assert "unhealthy: mq: driver disconnected for" in stderr

    broker = Broker(mosquitto_binary(), tmp_path, port)  # the broker comes up: reconnect
    try:
        wait_for(lambda: status_of(path)[1]["connected"] is True, timeout=60)
        wait_subscribed(port, store_dir)
        assert status_of(path)[0] == 0  # healthy again
        publish(port, [("sensors/x", b'{"i": 1}')])
        wait_for(lambda: ("sensors/x", {"i": 1}) in received(store_dir))
    finally:
        broker.stop()

    wait_for(lambda: status_of(path)[1]["connected"] is False, timeout=30)  # broker gone again
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert time.monotonic() - started < 10  # a broker that is down never holds shutdown up
    log = process.stderr.read()
    errors = [line for line in log.splitlines() if "ERROR collectors.mqtt.mq: connect:" in line]
    assert 1 <= len(errors) <= 3, log  # logged, but at most once a minute per outage
    assert received(store_dir) == [("sensors/x", {"i": 1})]
    _, report, _ = status_of(path)
    assert report["running"] is False
    assert report["last_stop"] == "SIGTERM received; 0 events left in the buffer"


class FailOnce(Failpoints):
    """Raises (not SIGKILL) the first time `name` is hit: a driver run that fails."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name, self.failed = name, False

    def hit(self, name: str) -> None:
        if name == self.name and not self.failed:
            self.failed = True
            msg = f"injected at {name}"
            raise OSError(msg)


def test_a_driver_restarted_after_a_failure_receives_again(
    make_config, service, store_dir, mosquitto
):
    """The failed run's client was stopped: the restarted run's client must not be silenced
    by it (it was: every message was dropped unacknowledged, with status `healthy`)."""
    config = make_config({"mq": mqtt_table(mosquitto.port)})
    failpoints = FailOnce("driver.after_append")
    running = service(config, failpoints)
    wait_subscribed(mosquitto.port, store_dir)  # its first batch fails after the commit
    assert failpoints.failed
    publish(mosquitto.port, [("sensors/a", json.dumps({"i": i}).encode()) for i in range(50)])
    wait_for(lambda: sorted(p["i"] for _, p in received(store_dir)) == list(range(50)), 20)
    running.stop()
    errors = Buffer(config.instances[0].buffer_file, 10).conn.execute("SELECT message FROM errors")
    assert ("OSError: injected at driver.after_append",) in errors.fetchall()


@pytest.mark.parametrize(
    "case",
    [
        ("json", b"[" * 5000 + b"]" * 5000, "payload is not json: maximum recursion depth"),
        ("text", b"\x01" * 2_000_000, "payload of 2000000 bytes is too large as JSON"),
        ("base64", bytes(7_000_000), "payload of 7000000 bytes is too large as JSON"),
    ],
)
def test_a_payload_that_cannot_be_buffered_is_quarantined(
    make_config, service, store_dir, mosquitto, case
):
    """Not a driver failure: that would have the broker send it again, forever."""
    payload_format, payload, reason = case
    table = mqtt_table(mosquitto.port, payload_format=payload_format)
    config = make_config({"mq": table})
    running = service(config)
    wait_subscribed(mosquitto.port, store_dir)
    publish(mosquitto.port, [("sensors/bad", payload), ("sensors/a", b'{"i": 1}')])
    wait_for(lambda: [t for t, _ in received(store_dir)] == ["sensors/a"], 30)
    running.stop()
    buffer = Buffer(config.instances[0].buffer_file, 10)
    (source, why) = buffer.conn.execute("SELECT source, reason FROM quarantine").fetchone()
    assert (source, why[: len(reason)]) == ("mqtt sensors/bad", reason)
    assert buffer.conn.execute("SELECT message FROM errors").fetchall() == []


def subscribed(buffer_file) -> list[str]:
    """The topic filters the broker confirmed, as the driver keeps them."""
    with contextlib.closing(sqlite3.connect(f"file:{buffer_file}?mode=ro", uri=True)) as conn:
        row = conn.execute("SELECT value FROM cursor WHERE name = 'mqtt'").fetchone()
    return json.loads(row[0])["topics"] if row else []


def test_a_retained_message_is_buffered_once_across_restarts(
    make_config, service, store_dir, mosquitto
):
    """The broker sends its retained messages on every SUBSCRIBE: a resumed session is not
    subscribed again (only to topics added since), so a restart does not take them twice.
    A retained value published while the collector is away is queued like any other."""
    config = make_config({"mq": mqtt_table(mosquitto.port)})
    publish(mosquitto.port, [("sensors/state", b'{"v": 1}')], retain=True)
    for _ in range(2):
        running = service(config)
        wait_subscribed(mosquitto.port, store_dir)
        running.stop()
    publish(mosquitto.port, [("sensors/state", b'{"v": 2}')], retain=True)
    added = make_config({"mq": mqtt_table(mosquitto.port, topics=["sensors/#", "other/+"])})
    running = service(added)
    wait_subscribed(mosquitto.port, store_dir)
    wait_for(lambda: "other/+" in subscribed(added.instances[0].buffer_file))  # SUBACK
    publish(mosquitto.port, [("other/x", b'{"v": 3}')])
    wait_for(lambda: ("other/x", {"v": 3}) in received(store_dir))
    running.stop()
    assert received(store_dir) == [
        ("sensors/state", {"v": 1}),
        ("sensors/state", {"v": 2}),
        ("other/x", {"v": 3}),
    ]


@pytest.mark.slow
def test_a_broker_restart_redelivers_without_duplicates(write_config, store_dir, tmp_path):
    """The broker keeps the session over a restart and sends what was not acknowledged
    again: the messages of the lost connection still waiting in a batch are dropped, not
    buffered a second time."""
    broker = Broker(mosquitto_binary(), tmp_path, persistent=True)
    table = mqtt_table(broker.port, max_delay_ms=6000, samples_per_event=500, max_inflight=100)
    path = write_config({"mq": table})
    try:
        with running_collector(path) as process:
            wait_subscribed(broker.port, store_dir)
            publish(broker.port, [("sensors/a", json.dumps({"i": i}).encode()) for i in range(10)])
            broker.stop()  # the 10 wait in the collector's batch, unacknowledged
            broker = Broker(mosquitto_binary(), tmp_path, broker.port, persistent=True)
            wait_for(lambda: len(received(store_dir)) >= 10, 30)
            time.sleep(1.0)
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
    finally:
        broker.stop()
    assert [p["i"] for _, p in received(store_dir)] == list(range(10))
