"""Collector metrics: a real `sluice collect` scraped over HTTP, against `collect status`."""

from __future__ import annotations

import os
import re
import signal
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collectors.buffer import Buffer
from collectors.buffer.schema import COUNTERS
from collectors.errors import ConfigError, MetricsUnavailable
from collectors.metrics import COUNTER_METRICS, serve_metrics

from .conftest import REPO, collect_status, free_port, run_cli, running_collector, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    """GET /metrics and parse it with prometheus_client's own text parser."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def value(samples: Samples, name: str, instance: str, **labels: str) -> float:
    """The one sample of `name` for `instance` (and `labels`); fails if there is not one."""
    found = [
        v
        for (n, pairs), v in samples.items()
        if n == name and {"instance": instance, **labels}.items() <= dict(pairs).items()
    ]
    assert len(found) == 1, (name, instance, labels, found)
    return found[0]


def labels_of(samples: Samples, name: str, instance: str) -> list[dict[str, str]]:
    return [
        dict(pairs)
        for (n, pairs) in samples
        if n == name and dict(pairs).get("instance") == instance
    ]


def listening_ports(pid: int) -> set[int]:
    """TCP ports process `pid` listens on: its socket fds matched to LISTEN rows of
    /proc/PID/net/tcp and tcp6."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


#: Counters of `collect status` and the metric each becomes (blocked_ms is served in seconds).
SERVED_AS = {key: f"sluice_collector_{name}_total" for key, (name, _) in COUNTER_METRICS.items()}


def assert_counters_between(before: dict, samples: Samples, after: dict) -> None:
    """Every counter of the scrape lies between the status reports taken before and after it
    (counters only grow), and so does `samples_read`."""
    name = before["name"]
    for key, metric in SERVED_AS.items():
        scale = 1000.0 if key == "blocked_ms" else 1.0
        low, high = before["counters"].get(key, 0), after["counters"].get(key, 0)
        assert low / scale <= value(samples, metric, name) <= high / scale, (key, low, high)
    read = value(samples, "sluice_collector_samples_read_total", name)
    assert before["samples_read"] <= read <= after["samples_read"]


def generator(**extra: object) -> dict:
    return {
        "driver": "generator",
        "stream": "lab/gen",
        "samples_per_sec": 2000,
        "samples_per_event": 100,
    } | extra


def refused_mqtt(port: int) -> dict:
    """An MQTT instance whose broker is not there: the driver's error, and unhealthy."""
    return {
        "driver": "mqtt",
        "stream": "lab/mqtt",
        "host": "127.0.0.1",
        "port": port,
        "topics": ["sensors/#"],
        "client_id": "sluice-test-metrics",
    }


def test_the_endpoint_serves_what_collect_status_says(write_config, tmp_path):
    port = free_port()
    path = write_config(
        {"gen": generator(max_samples=8000), "mq": refused_mqtt(free_port())},
        metrics_port=port,
        unhealthy_after_seconds=1,
    )
    with running_collector(path) as process:
        wait_for(lambda: answers(port), timeout=30)
        assert listening_ports(process.pid) == {port}  # the endpoint, and nothing else

        # While the generator samples: every counter of a scrape lies between two reports.
        wait_for(lambda: collect_status(path)["gen"]["counters"].get("events_committed", 0) >= 5)
        before = collect_status(path)
        samples = scrape(port)
        after = collect_status(path)
        assert_counters_between(before["gen"], samples, after["gen"])
        assert value(samples, "sluice_collector_buffer_capacity_events", "gen") == 100_000

        # Once it has sent all 8000 samples nothing moves: the scrape equals the report.
        wait_for(lambda: collect_status(path)["gen"]["counters"].get("samples_committed") == 8000)
        before = collect_status(path)["gen"]
        samples, after = scrape(port), collect_status(path)["gen"]
        assert_counters_between(before, samples, after)
        assert before["counters"] == after["counters"]
        assert value(samples, "sluice_collector_samples_read_total", "gen") == 8000
        assert value(samples, "sluice_collector_events_buffered_total", "gen") == 80
        assert value(samples, "sluice_collector_events_committed_total", "gen") == 80
        for metric, key in [
            ("buffer_depth_events", "depth_events"),
            ("buffer_queued_samples", "queued_samples"),
            ("pending_txns", "pending_txns"),
            ("doubtful_txns", "doubtful_txns"),
        ]:
            assert value(samples, f"sluice_collector_{metric}", "gen") == after[key] == 0
        last = value(samples, "sluice_collector_last_committed_timestamp_seconds", "gen")
        assert last == after["last_committed_ns"] / 1e9
        lag = value(samples, "sluice_collector_lag_seconds", "gen")
        assert before["lag_seconds"] <= lag <= after["lag_seconds"]
        assert value(samples, "sluice_collector_running", "gen") == 1
        assert value(samples, "sluice_collector_healthy", "gen") == 1 and after["healthy"]
        assert labels_of(samples, "sluice_collector_driver_connected", "gen") == []
        assert labels_of(samples, "sluice_collector_last_error_timestamp_seconds", "gen") == []
        assert labels_of(samples, "sluice_collector_instance_info", "gen") == [
            {
                "instance": "gen",
                "driver": "generator",
                "stream": "lab/gen",
                "txn_protocol": "auto",
                "txn_protocol_used": "flush",
            }
        ]

        # The MQTT driver cannot reach its broker: unhealthy, with its last error.
        wait_for(lambda: not collect_status(path)["mq"]["healthy"], timeout=30)
        before = collect_status(path)["mq"]
        samples, after = scrape(port), collect_status(path)["mq"]
        assert after["healthy"] is False and after["connected"] is False
        assert value(samples, "sluice_collector_healthy", "mq", driver="mqtt") == 0
        assert value(samples, "sluice_collector_running", "mq", driver="mqtt") == 1
        assert value(samples, "sluice_collector_driver_connected", "mq", driver="mqtt") == 0
        assert_counters_between(before, samples, after)
        error = after["last_errors"][0]
        assert error["source"] == "mqtt.connect" and "Connection refused" in error["message"]
        # one series per source: the refused connection's, and (when the driver itself
        # failed and restarted meanwhile) the driver's; each one collect status lists
        served = labels_of(samples, "sluice_collector_last_error_timestamp_seconds", "mq")
        assert {
            "instance": "mq",
            "driver": "mqtt",
            "source": "mqtt.connect",
            "message": error["message"],
        } in served
        assert {s["source"] for s in served} <= {e["source"] for e in after["last_errors"]}
        when = value(
            samples, "sluice_collector_last_error_timestamp_seconds", "mq", source="mqtt.connect"
        )
        assert when == error["time_ns"] / 1e9
        assert labels_of(samples, "sluice_collector_lag_seconds", "mq") == []  # none sent

        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, process.stderr.read()
    log = process.stderr.read()
    assert f"metrics: http://127.0.0.1:{port}/metrics" in log
    assert not answers(port)  # the endpoint ended with the service


def test_without_metrics_port_nothing_listens(write_config):
    path = write_config({"gen": generator()})
    with running_collector(path) as process:
        wait_for(lambda: collect_status(path)["gen"]["counters"].get("events_committed", 0) >= 3)
        assert listening_ports(process.pid) == set()
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, process.stderr.read()
    assert "metrics:" not in process.stderr.read()


def test_a_port_in_use_stops_the_collector_before_it_samples(write_config, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = write_config({"gen": generator()}, metrics_port=port)
        result = run_cli("collect", "--config", str(path), timeout=60)
    assert result.returncode == 1
    expected = (
        f"sluice: error: metrics endpoint 127.0.0.1:{port} cannot listen: the port is in use "
        "(another collector, or another program); set another metrics_port (or "
        "metrics_address) in [collector], or stop what holds that port"
    )
    assert result.stderr.strip().splitlines() == [expected]
    assert not (tmp_path / "state" / "gen.db").exists()  # nothing was sampled


def test_a_stopped_instance_is_served_from_its_buffer(make_config, tmp_path):
    """In process, on a buffer no collector runs: not running, its counters as stored, a
    driver's own counter, time blocked in seconds; an instance never started is all zeros."""
    config = make_config(
        {"gen": generator(), "idle": generator(stream="lab/idle")},
        metrics_port=free_port(),
    )
    (tmp_path / "state").mkdir()
    buffer = Buffer(tmp_path / "state" / "gen.db", 10)
    buffer.add_counters({"samples_buffered": 500, "samples_shed": 20, "blocked_ms": 1500})
    buffer.add_counters({"files_done": 2})
    buffer.close()
    endpoint = serve_metrics(config)
    assert endpoint is not None
    try:
        samples = scrape(config.metrics_port)
    finally:
        endpoint.close()
    assert value(samples, "sluice_collector_running", "gen") == 0
    assert value(samples, "sluice_collector_healthy", "gen") == 0
    assert value(samples, "sluice_collector_samples_read_total", "gen") == 520
    assert value(samples, "sluice_collector_samples_shed_total", "gen") == 20
    assert value(samples, "sluice_collector_blocked_seconds_total", "gen") == 1.5
    assert value(samples, "sluice_collector_driver_counter_total", "gen", counter="files_done") == 2
    for metric in [*SERVED_AS.values(), "sluice_collector_samples_read_total"]:
        assert value(samples, metric, "idle") == 0
    assert not answers(config.metrics_port)


def test_every_buffer_counter_is_served():
    assert set(COUNTER_METRICS) == set(COUNTERS)


def test_the_endpoint_binds_loopback_unless_told(make_config):
    config = make_config({"gen": generator()}, metrics_port=9464)
    assert (config.metrics_port, config.metrics_address) == (9464, "127.0.0.1")
    config = make_config({"gen": generator()}, metrics_port=9464, metrics_address="0.0.0.0")
    assert config.metrics_address == "0.0.0.0"
    config = make_config({"gen": generator()}, metrics_port="9464", metrics_address="::1")
    assert (config.metrics_port, config.metrics_address) == (9464, "::1")
    assert make_config({"gen": generator()}).metrics_port is None


@pytest.mark.parametrize(
    ("port", "problem"),
    [
        (0, "metrics_port = 0 is not a TCP port; use a fixed port from 1 to 65535"),
        (65536, "metrics_port = 65536 is not a TCP port; use a fixed port from 1 to 65535"),
        (-1, "metrics_port = -1 is not a TCP port; use a fixed port from 1 to 65535"),
        ("http", "metrics_port = 'http' is not a whole number"),
        (True, "metrics_port = true is not a whole number"),
        (9464.5, "metrics_port = 9464.5 is not a whole number"),
    ],
)
def test_bad_metrics_ports_are_refused(make_config, port, problem):
    with pytest.raises(ConfigError, match=re.escape(f"[collector]: collector.{problem}")):
        make_config({"gen": generator()}, metrics_port=port)


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            {"metrics_port": 9464, "metrics_address": "localhost"},
            "collector.metrics_address = 'localhost' is not an IP address; use 127.0.0.1",
        ),
        (
            {"metrics_address": "0.0.0.0"},
            "collector.metrics_address = '0.0.0.0' is set but metrics_port is not; set "
            "metrics_port too",
        ),
    ],
)
def test_bad_metrics_addresses_are_refused(make_config, settings, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)):
        make_config({"gen": generator()}, **settings)


def test_an_address_not_of_this_box_is_a_clear_error(make_config):
    config = make_config(
        {"gen": generator()}, metrics_port=free_port(), metrics_address="192.0.2.1"
    )
    with pytest.raises(MetricsUnavailable, match=re.escape("the address is not one of this box's")):
        serve_metrics(config)


def test_the_docker_deployment_exposes_the_port_its_collector_serves():
    import tomllib

    import yaml

    docker = REPO / "docker"
    collector = tomllib.loads((docker / "collector.toml").read_text())["collector"]
    service = yaml.safe_load((docker / "compose.yaml").read_text())["services"]["collector"]
    assert [int(p) for p in service["expose"]] == [collector["metrics_port"]]
    assert "ports" not in service  # on the compose network only, never on a host interface
    dockerfile = (docker / "collector.Dockerfile").read_text()
    assert f"EXPOSE {collector['metrics_port']}\n" in dockerfile


def test_a_status_probe_at_start_up_is_waited_for_not_taken_for_an_owner(make_config):
    """`collect status` and every scrape take a shared lock on an instance's lock file for a
    moment; a collector starting meanwhile waits for it rather than refusing to start."""
    import fcntl
    import threading
    import time

    from collectors.errors import BufferLocked
    from collectors.instance import LOCK_PATIENCE_SECONDS, lock_buffer

    inst = make_config({"gen": generator()}).instances[0]
    inst.buffer_file.parent.mkdir(parents=True)
    lock_file = inst.buffer_file.with_name(inst.buffer_file.name + ".lock")
    probe = os.open(lock_file, os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
    threading.Timer(0.3, os.close, (probe,)).start()  # the probe lets go
    os.close(lock_buffer(inst, 0o600))

    owner = os.open(lock_file, os.O_RDONLY)
    fcntl.flock(owner, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held for good: another collector
    try:
        started = time.monotonic()
        with pytest.raises(BufferLocked, match=re.escape("is in use by another running")):
            lock_buffer(inst, 0o600)
        assert time.monotonic() - started >= LOCK_PATIENCE_SECONDS
    finally:
        os.close(owner)
